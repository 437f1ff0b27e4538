#!/usr/bin/env bash
# BENCHMARKS.md "8-bit weights": one part per ten-minute device call.
#   bash benchmarks/quantized.sh OUT_DIR kernels   # GPU tests, GEMM table,
#                                                  # row invariance
#   bash benchmarks/quantized.sh OUT_DIR sweep     # wide row tiles at 144
#                                                  # rows, XLA's fp8 GEMM
#   [SPLIT=N] [STREAM_MAX_Q=N] bash benchmarks/quantized.sh OUT_DIR steps
#   bash benchmarks/quantized.sh OUT_DIR small     # batch 1: 8-bit embedding,
#                                                  # the latency tiling
#   [FORMATS=fp8] [SKIP_ERROR=1] [ALL8=1] bash benchmarks/quantized.sh OUT_DIR quality
#                                                  # logit error, accuracy
#                                                  # (ALL8: 8-bit head, embedding)
source "$(dirname "$0")/common.sh"
PART=${2:?part: kernels, sweep, steps, small or quality}
S="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1 \
--gen 512 --only flash-dllm --steady ${SPLIT:+--attention-split-target $SPLIT}"
case $PART in
kernels)
  JAX_PLATFORMS=cuda timeout 170 python -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_kernel_qmatmul.py tests/test_kernel_token_logprob.py \
      -k "rows_do_not_depend or llada_shapes or token" \
      > "$OUT/gpu-tests.log" 2>&1; tail -n 2 "$OUT/gpu-tests.log"
  timeout 200 python scripts/bench_kernels.py "$OUT/qmatmul.json" --qmatmul \
      --ms 16,144,4608 --markdown "$OUT/qmatmul.md" > "$OUT/qmatmul.log" 2>&1
  cat "$OUT/qmatmul.md"
  timeout 100 python tools/probe_batch_invariance.py --sets 4 --quantize \
      | tee "$OUT/gemm-rows-8bit.md"
  ;;
sweep)
  timeout 240 python scripts/bench_kernels.py "$OUT/qmatmul-wide-144.json" --qmatmul \
      --ms 144 --tune --tune-limit 9 --match pallas \
      --markdown "$OUT/qmatmul-wide-144.md" > "$OUT/qmatmul-wide-144.log" 2>&1
  timeout 120 python scripts/bench_kernels.py "$OUT/qmatmul-xla.json" --qmatmul \
      --ms 144,4608 --match "fp8_w8a8 xla" --markdown "$OUT/qmatmul-xla.md" \
      > "$OUT/qmatmul-xla.log" 2>&1
  cat "$OUT/qmatmul-wide-144.md" "$OUT/qmatmul-xla.md"
  ;;
steps)
  Q=${STREAM_MAX_Q:+--stream-max-q $STREAM_MAX_Q}
  $S --batch 1 32 --json "$OUT/bf16.json" | grep '^|'
  $S --batch 1 32 --quantize fp8 $Q --json "$OUT/fp8.json" | grep '^| f'
  $S --batch 1 --quantize int8 $Q --json "$OUT/int8.json" | grep '^| f'
  $S --batch 1 --quantize fp8 --quantize-head $Q --json "$OUT/fp8-head.json" \
      | grep '^| f'
  ;;
small)
  $S --batch 1 --json "$OUT/small-bf16.json" | grep '^|'
  $S --batch 1 --quantize fp8 --quantize-head --quantize-embedding \
      --json "$OUT/small-fp8-head-embedding.json" | grep '^| f'
  $S --batch 1 --attention-split-target 132 --json "$OUT/small-bf16-latency.json" \
      | grep '^| f'
  $S --batch 1 --attention-split-target 132 --quantize fp8 --quantize-head \
      --quantize-embedding --json "$OUT/small-fp8-all-latency.json" | grep '^| f'
  ;;
quality)
  [ -n "${SKIP_ERROR:-}" ] || timeout 150 python scripts/quant_error.py --random-shapes llada-8b \
      --batch 4 --length 512 --gen 128 > "$OUT/error-llada-8b.md"
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.13
  groups=("llada threshold fast-dllm-prefix" "fast-dllm-dual elastic-cache flash-cache"
          "flash-dllm flash-cache-confident flash-dllm-confident")
  for fmt in ${FORMATS:-fp8 int8}; do
    for i in 0 1 2; do
      name=quality-1000-gen192-$fmt${ALL8:+-all8}-$i
      (timeout ${EVAL_SECONDS:-400} python scripts/eval_quality.py --limit 1000 \
           --gen-lengths 192 --strategies ${groups[$i]} --quantize $fmt \
           ${ALL8:+--quantize-head --quantize-embedding} \
           --no-progress --out-dir "$OUT/$name" > "$OUT/$name.log" 2>&1) &
    done
  done
  wait
  grep -h "^|" "$OUT"/quality-*/*.md | sort -u
  ;;
esac
