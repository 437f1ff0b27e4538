#!/usr/bin/env bash
# BENCHMARKS.md "Strategy steps": ms per decode step of every strategy at
# LLaDA-8B shapes (random bf16 weights, prompt 768, 4 tokens per step),
# batch 1 and 32, gen 256 and 512; the window strategies also with the
# steady step (the prefill left out). One process per strategy, spread over
# the GPUs; the whole grid takes more than one ten-minute device call, so
# name the strategies to run after OUT_DIR:
#   bash benchmarks/strategies.sh OUT_DIR flash-dllm flash-cache
# "Block-causal dense families": SDAR-8B and Fast-dLLM-v2-7B shapes, batch 1
# and 32, and Fast-dLLM v2's sub-block cache at batch 32 (one device call):
#   bash benchmarks/strategies.sh OUT_DIR families
source "$(dirname "$0")/common.sh"
shift
if [ "${1:-}" = families ]; then
  F="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 768 --gen 512 --block 32 --reps 1"
  for m in sdar-8b fast-dllm-v2-7b; do
    $F --model $m --batch 1 32 --steady --json "$OUT/$m.json" | grep -E "^\|"
  done
  $F --model fast-dllm-v2-7b --batch 32 --small-block 8 \
      --json "$OUT/fast-dllm-v2-subblock.json" | grep -E "^\|"
  exit 0
fi
strategies=${*:-llada fast-dllm-prefix fast-dllm-dual elastic-cache flash-cache flash-dllm}
gpu=0
for s in $strategies; do
  steady=; case $s in flash-*) steady=--steady ;; esac
  (CUDA_VISIBLE_DEVICES=$gpu python scripts/bench_strategies.py --prompt 768 \
       --per-step 4 --reps 1 --batch 1 32 --gen 256 512 --only $s $steady \
       --json "$OUT/$s.json" > "$OUT/$s.log" 2>&1) &
  gpu=$(( gpu + 1 ))
  if [ $gpu -ge "$(( NGPU > 0 ? NGPU : 1 ))" ]; then wait; gpu=0; fi
done
wait
grep -h "^|" "$OUT"/*.log
