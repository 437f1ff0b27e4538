#!/usr/bin/env bash
# BENCHMARKS.md "Forward": the full forward and the reference samplers'
# step at LLaDA-8B and Dream-7B shapes, random bf16 weights (one GPU).
source "$(dirname "$0")/common.sh"
python scripts/bench_forward.py --arch llada --batch 1 32 --seq 1024 \
    --decode 1 8 --gen 256 --json "$OUT/llada.json" | tee "$OUT/llada.log"
python scripts/bench_forward.py --arch dream --batch 1 32 --seq 1024 \
    --head-rows 1024 --decode 1 --gen 256 --reps 5 --json "$OUT/dream.json" \
    | tee "$OUT/dream.log"
