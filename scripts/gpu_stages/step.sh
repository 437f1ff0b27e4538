# Stage 'step' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR step
# step (next session, 2 GPUs, <= 8 minutes): no Flash-dLLM step at LLaDA-8B
# shapes finished within 160-230 s in the fourth session (the third
# session's took < 150 s for batch 1 and 32); the mass sum is now a tree of
# 7 adds, not a chain of 95. GPU 0 alone: the step, with progress lines.
# GPU 1: the kernel tests (the batch-128 row test, the new token kernel),
# then whether cuBLAS columns are invariant to N (exact tensor parallelism).
step() {
  (export CUDA_VISIBLE_DEVICES=1 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_attention.py \
       tests/test_kernel_token_logprob.py > "$OUT/gpu_tests.log" 2>&1
   timeout 150 python scripts/probe_column_invariance.py \
       > "$OUT/probe_columns.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 420 python scripts/bench_strategies.py \
      --prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm \
      flash-cache --batch 1 32 --json "$OUT/step.json" > "$OUT/step.log" 2>&1
  wait
}
