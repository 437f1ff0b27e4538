# Stage 'followup' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR followup
# followup (2026-11-30, second session; run then with the cuDNN split of
# 4bb1d87, reverted since): batch-32 steps, the kernel shapes the first stage had no
# time for, the GPU test of that split, continuous batching on the GPU, and
# whether a mesh changes the shipped model's answers.
followup() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  (CUDA_VISIBLE_DEVICES=0 timeout 170 $s --batch 32 --gen 512 \
      --json "$OUT/strategies_split.json" --only flash-dllm flash-cache \
      > "$OUT/strategies.log" 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 90 python scripts/bench_kernels.py "$OUT/kernels_last.json" \
       --skip-done benchmarks/results/2026-11-30-h200-kernels-*.json
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_ops_attention.py
   timeout 150 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
  ) > "$OUT/gpu1.log" 2>&1
  wait
  for mesh in none model=2 data=2; do
    local m=""; [ "$mesh" != none ] && m="--mesh $mesh"
    timeout 90 $q $m --out-dir "$OUT/q_$mesh" > "$OUT/q_$mesh.log" 2>&1
  done
  for mesh in model=2 data=2; do
    python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_$mesh" \
        >> "$OUT/mesh_tokens.log" 2>&1
  done
}
