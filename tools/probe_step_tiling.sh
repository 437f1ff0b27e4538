#!/usr/bin/env bash
# One-off: Flash-dLLM step at LLaDA-8B shapes, gen 512, old tree vs new
# token_logprob and attention tilings. Deleted once written down.
OUT=${1:?}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
B="--prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm --steady"
run() { name=$1; shift; echo "== $name $*"; timeout 200 python scripts/bench_strategies.py $B "$@" --json "$OUT/$name.json" 2>&1 | grep -v Warning | tail -4; }
(cd baseline && timeout 200 python scripts/bench_strategies.py $B --batch 1 32 --json "$OUT/old.json" 2>&1 | tail -4)
run new --batch 1 32
run split132 --batch 1 --split-target 132
run bk128 --batch 1 --attention-block-k 128 --attention-stages 2
run both --batch 1 --split-target 132 --attention-block-k 128 --attention-stages 2
