# Stage 'confirm' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR confirm
# confirm (fourth session, 2 GPUs, <= 9.7 minutes): the isolate stage's probe
# found the first difference in a confidence (logits equal, the sum over the
# vocabulary in another order); ops.token_logprob now runs a fixed-order
# kernel. GPU 0: its GPU tests, then answers alone vs data=2 (the probe
# again only if they still differ). GPU 1 first: the Flash-dLLM step with
# the kernel, with cuBLAS GEMMs, and with cuBLAS and one key split.
confirm() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  local cublas=--xla_gpu_enable_triton_gemm=false
  (export CUDA_VISIBLE_DEVICES=1
   timeout 160 $s --batch 1 32 --json "$OUT/perf_default.json"
   XLA_FLAGS=$cublas timeout 160 $s --split-target 96 --batch 1 32 \
       --json "$OUT/perf_cublas_split96.json"
   XLA_FLAGS=$cublas timeout 120 $s --batch 32 --json "$OUT/perf_cublas.json"
  ) > "$OUT/perf.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_token_logprob.py \
       > "$OUT/gpu_tests.log" 2>&1
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1)
  wait
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data2" > "$OUT/q_data2.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data2" \
      > "$OUT/mesh_tokens.log" 2>&1
  if grep -q differ "$OUT/mesh_tokens.log"; then
    timeout 90 python scripts/probe_row_invariance.py --limit 128 \
        --bucket-with 18 --batch 128 --sub 128 --sub-mesh data=2 \
        --xla-note "17-row bucket, kernel" --json "$OUT/probe_b17.json" \
        > "$OUT/probe_b17.log" 2>&1
  fi
}
