#!/usr/bin/env bash
# BENCHMARKS.md "Strategy steps": ms per decode step of every strategy at
# LLaDA-8B shapes (random bf16 weights, prompt 768, 4 tokens per step),
# batch 1 and 32, gen 256 and 512; the window strategies also with the
# steady step (the prefill left out). About 20 minutes on one GPU: with two
# GPUs the halves run side by side; or pass a half (a or b) as the second
# argument, one per device call.
source "$(dirname "$0")/common.sh"
S="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
half_a() {
  $S --batch 1 32 --gen 256 512 --steady --only flash-dllm flash-cache \
      --json "$OUT/flash.json"
  $S --batch 1 32 --gen 256 512 --only fast-dllm-dual elastic-cache \
      --json "$OUT/cached.json"
}
half_b() {
  $S --batch 1 32 --gen 256 512 --only llada fast-dllm-prefix \
      --json "$OUT/uncached.json"
}
case "${2:-both}" in
  a) half_a > "$OUT/a.log" 2>&1 ;;
  b) half_b > "$OUT/b.log" 2>&1 ;;
  *) if [ "$NGPU" -ge 2 ]; then
       (CUDA_VISIBLE_DEVICES=0 half_a > "$OUT/a.log" 2>&1) &
       (CUDA_VISIBLE_DEVICES=1 half_b > "$OUT/b.log" 2>&1)
       wait
     else
       half_a > "$OUT/a.log" 2>&1; half_b > "$OUT/b.log" 2>&1
     fi ;;
esac
grep -h "^|" "$OUT"/*.log
