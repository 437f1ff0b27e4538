#!/usr/bin/env bash
# Every GPU benchmark in one call on a host with 2 GPUs (one GPU works too:
# the mesh stage is then skipped). Stages are time-capped so a slow one
# cannot eat the others; each script prints its rows as it measures them.
#
#   bash scripts/bench_suite.sh OUT_DIR single   # <= 9 minutes on 2 x H200
#   bash scripts/bench_suite.sh OUT_DIR mesh     # <= 3.5 minutes
#   bash scripts/bench_suite.sh OUT_DIR          # both: over one call's 10 min
#   bash scripts/bench_suite.sh OUT_DIR STAGE    # scripts/gpu_stages/STAGE.sh:
#     the single-purpose calls, each with its time and why it was run (next:
#     step, then quality64)
#
# OUT_DIR gets more files than a device call brings back: tar it.
#
# single, in parallel: kernels and the GPU tests on GPU 1 (on GPU 0 after
# the strategies when there is one GPU), strategies on GPU 0. mesh: the
# two-GPU data- and tensor-parallel benchmark.
set -u
OUT=${1:?usage: bench_suite.sh OUT_DIR [single|mesh|all]}
STAGE=${2:-all}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $NGPU" | tee "$OUT/suite.log"

kernels() {
  local k="python scripts/bench_kernels.py"
  # The shapes earlier runs left unmeasured (2026-11-30: Dream attention at
  # Q = 32/128, the LLaDA down projection and every Dream matmul), then a
  # tiling sweep where the default tiles lost to cuDNN (LLaDA Q = 128).
  timeout 300 $k "$OUT/kernels_rest.json" \
      --skip-done benchmarks/results/2026-11-30-h200-kernels-*.json
  timeout 120 $k "$OUT/kernels_tune.json" --tune --tune-limit 12 --reps 5 \
      --inner 20 --ops attention \
      --match '^attention llada B=(8|32) S=2048 Q=128 '
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_gpu_integration.py tests/test_ops_attention.py
}

strategies() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  timeout 150 $s --batch 1 32 --gen 512 --json "$OUT/strategies_verify.json" \
      --only flash-dllm
  timeout 180 $s --batch 1 32 --gen 256 --json "$OUT/strategies_256.json" \
      --only flash-dllm flash-cache fast-dllm-dual elastic-cache
  timeout 90 $s --batch 1 --gen 512 --json "$OUT/strategies_b1.json" \
      --only llada fast-dllm-prefix elastic-cache
}

if [ -f "scripts/gpu_stages/$STAGE.sh" ]; then
  source "scripts/gpu_stages/$STAGE.sh"
  "$STAGE"; echo "done" >> "$OUT/suite.log"; exit 0
fi
if [ "$STAGE" != all ] && [ "$STAGE" != single ] && [ "$STAGE" != mesh ]; then
  echo "unknown stage $STAGE: all, single, mesh or one of scripts/gpu_stages/" >&2
  exit 2
fi
if [ "$STAGE" != mesh ]; then
  if [ "$NGPU" -ge 2 ]; then
    (CUDA_VISIBLE_DEVICES=1 kernels > "$OUT/kernels.log" 2>&1) &
    (CUDA_VISIBLE_DEVICES=0 strategies > "$OUT/strategies.log" 2>&1)
    wait
  else
    strategies > "$OUT/strategies.log" 2>&1
    kernels > "$OUT/kernels.log" 2>&1
  fi
fi
if [ "$STAGE" != single ] && [ "$NGPU" -ge 2 ]; then
  timeout 200 python scripts/bench_mesh.py "$OUT/mesh.json" --reps 1 \
      > "$OUT/mesh.log" 2>&1
fi
echo "done" >> "$OUT/suite.log"
