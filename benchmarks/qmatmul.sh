#!/usr/bin/env bash
# BENCHMARKS.md "Kernels", 8-bit weights: the --qmatmul table (the bf16 XLA
# dot against the 8-bit weight-streaming kernel and XLA's W8A8 / int8 dots
# at LLaDA-8B's projections, with the copy, bf16 and fp8 matmul rates of the
# same run) in two halves by M, then the kernel's GPU tests. A second
# argument `bench` or `tests` runs only that part (each fits one 10-minute
# device call).
source "$(dirname "$0")/common.sh"
PART=${2:-all}
K="python scripts/bench_kernels.py"
if [ "$PART" != tests ]; then
  for ms in 16,144 1024,4608; do
    timeout ${HALF_SECONDS:-280} $K "$OUT/qmatmul-m${ms/,/-}.json" \
        --qmatmul --ms $ms | tee "$OUT/qmatmul-m${ms/,/-}.log"
  done
  cat "$OUT/qmatmul-m16-144.md" "$OUT/qmatmul-m1024-4608.md" \
      > "$OUT/qmatmul.md"
fi
if [ "$PART" != bench ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 500 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_kernel_qmatmul.py \
      > "$OUT/gpu-tests-qmatmul.log" 2>&1
  tail -n 3 "$OUT/gpu-tests-qmatmul.log"
fi
