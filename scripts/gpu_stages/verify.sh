# Stage 'verify' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR verify
# verify (next session, first call): the GPU side of what the second
# 2026-11-30 session changed without device time left. GPU tests of the
# split merge kernel and of per-shard attention; answers of static vs
# continuous batching and of 1 GPU vs data=2 / model=2 (must now agree
# except model=2's reordered sums); the Flash-dLLM step with the
# batch-independent splits (its cost against 12.84 / 166.8 ms).
verify() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  (export CUDA_VISIBLE_DEVICES=0
   JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 \
       python -m pytest -q -m gpu -p no:cacheprovider \
       tests/test_kernel_attention.py tests/test_ops_attention.py \
       tests/test_gpu_integration.py
   timeout 150 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
       --reps 1 --batch 1 32 --gen 512 --only flash-dllm \
       --json "$OUT/strategies_verify.json"
  ) > "$OUT/gpu0.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 120 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1
  ) > "$OUT/gpu1.log" 2>&1
  wait
  for mesh in data=2 model=2; do
    timeout 60 $q --mesh $mesh --out-dir "$OUT/q_$mesh" > "$OUT/q_$mesh.log" 2>&1
    python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_$mesh" \
        >> "$OUT/mesh_tokens.log" 2>&1
  done
}
