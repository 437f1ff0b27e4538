#!/usr/bin/env bash
# Every GPU benchmark in one call on a host with 2 GPUs (one GPU works too:
# the mesh stage is then skipped). Stages are time-capped so a slow one
# cannot eat the others; each script prints its rows as it measures them.
#
#   bash scripts/bench_suite.sh OUT_DIR          # ~8.5 minutes on 2 x H200
#
# OUT_DIR gets more files than a device call brings back: tar it.
#
# Phase 1, in parallel: kernels on GPU 1 (on GPU 0 after the strategies
# when there is one GPU), strategies on GPU 0. Phase 2: the two-GPU mesh.
set -u
OUT=${1:?usage: bench_suite.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $NGPU" | tee "$OUT/suite.log"

kernels() {
  local k="python scripts/bench_kernels.py"
  timeout 80 $k "$OUT/kernels_cache_matmul.json" --ops cache,matmul
  timeout 90 $k "$OUT/kernels_attention_dream.json" \
      --ops attention,attention+mass --models dream
  timeout 90 $k "$OUT/kernels_tune.json" --tune --tune-limit 12 --reps 5 \
      --inner 20 --ops attention,matmul \
      --match '^attention dream .*S=2048 Q=(16|128) |^matmul .* M=128 '
  timeout 80 $k "$OUT/kernels_attention_llada.json" \
      --ops attention,attention+mass --models llada
}

strategies() {
  timeout 150 python scripts/bench_strategies.py --batch 1 32 --gen 512 \
      --prompt 768 --per-step 4 --reps 1 --json "$OUT/strategies_512.json" \
      --only flash-dllm flash-cache fast-dllm-dual fast-dllm-prefix
  timeout 90 python scripts/bench_strategies.py --batch 1 --gen 256 512 \
      --prompt 768 --per-step 4 --reps 1 --json "$OUT/strategies_b1.json" \
      --only llada elastic-cache flash-dllm
  timeout 60 python scripts/bench_strategies.py --batch 32 --gen 256 \
      --prompt 768 --per-step 4 --reps 1 --json "$OUT/strategies_256.json" \
      --only flash-dllm elastic-cache
}

if [ "$NGPU" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=1 kernels > "$OUT/kernels.log" 2>&1) &
  (CUDA_VISIBLE_DEVICES=0 strategies > "$OUT/strategies.log" 2>&1)
  wait
  timeout 150 python scripts/bench_mesh.py "$OUT/mesh.json" --reps 1 \
      > "$OUT/mesh.log" 2>&1
else
  strategies > "$OUT/strategies.log" 2>&1
  kernels > "$OUT/kernels.log" 2>&1
fi
echo "done" >> "$OUT/suite.log"
