#!/usr/bin/env bash
# BENCHMARKS.md "LLaDA2 (MoE) steps": strategy llada2 at LLaDA2.0-mini
# shapes (random bf16 weights, prompt 768, gen 512, 16 tokens per step),
# batch 1 and 32, and one MoE layer alone with its routed experts by the
# grouped kernel and by the dense every-expert path; beside them the dense
# LLaDA-8B reference sampler (`llada`) at the same shapes, measured in the
# same run.
source "$(dirname "$0")/common.sh"
python scripts/bench_moe.py --batch 1 32 --json "$OUT/moe.json" \
    > "$OUT/moe.log" 2>&1
python scripts/bench_strategies.py --only llada --batch 1 32 --gen 512 \
    --prompt 768 --per-step 16 --reps 1 --json "$OUT/dense.json" \
    > "$OUT/dense.log" 2>&1
grep -h "^|\|^{\|device" "$OUT"/moe.log "$OUT"/dense.log
