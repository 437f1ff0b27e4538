#!/usr/bin/env bash
# BENCHMARKS.md "Kernels": every kernel against the best XLA composition
# over the whole shape grid, the tiling sweep, and the kernels' GPU tests.
# The grid takes more than one 10-minute device call: run it again with the
# same OUT_DIR and --skip-done resumes where the last call stopped.
source "$(dirname "$0")/common.sh"
K="python scripts/bench_kernels.py"
done_files=$(ls "$OUT"/grid-*.json 2>/dev/null)
timeout ${GRID_SECONDS:-420} $K "$OUT/grid-$(date -u +%H%M%S).json" \
    ${done_files:+--skip-done $done_files} | tee -a "$OUT/grid.log"
timeout 120 $K "$OUT/tune.json" --tune --tune-limit 12 --reps 5 --inner 20 \
    --ops attention \
    --match '^attention (llada B=(8|32) S=2048 Q=128|dream .*S=2048 Q=(16|128)) ' \
    | tee "$OUT/tune.log"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_kernel_attention.py \
    tests/test_kernel_attention_bits.py \
    tests/test_kernel_rms_norm.py tests/test_kernel_token_logprob.py \
    tests/test_gpu_integration.py tests/test_ops_attention.py \
    > "$OUT/gpu-tests.log" 2>&1
tail -n 3 "$OUT/gpu-tests.log"
python scripts/bench_report.py "$OUT"/grid-*.json > "$OUT/report.md"
