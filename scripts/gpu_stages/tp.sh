# Stage 'tp' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR tp
# tp (fifth session, 2 GPUs, <= 6.5 minutes): tensor parallelism made exact
# (column-parallel output projections with all-gathers, key splits from the
# global head count, the attention mass summed per head then over heads in
# one order). The shipped model's answers without a mesh, under model=2 and
# under data=2 for four strategies, compared token by token. The step times
# at LLaDA-8B shapes are a separate call: bench_mesh.py (random weights:
# every token a near-tie, so its "tokens = 1 GPU" is a strict test too).
tp() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-cache flash-dllm --no-progress"
  # GPU 1 meanwhile: the GPU tests of the attention kernel, whose mass is
  # now summed per head and then over heads (row-alone bits at batch 128).
  (export CUDA_VISIBLE_DEVICES=1 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 170 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_attention.py \
       tests/test_ops_attention.py > "$OUT/gpu_tests.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 130 $q --out-dir "$OUT/q_none" \
      > "$OUT/q_none.log" 2>&1
  wait
  timeout 130 $q --mesh model=2 --out-dir "$OUT/q_model2" \
      > "$OUT/q_model2.log" 2>&1
  timeout 110 $q --mesh data=2 --out-dir "$OUT/q_data2" \
      > "$OUT/q_data2.log" 2>&1
  for m in model2 data2; do
    python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_$m" \
        > "$OUT/tokens_$m.log" 2>&1
  done
}
