# Stage 'gemm' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR gemm
# gemm (fifth session, 2 GPUs, <= 7.5 minutes): the batch-invariance GEMM
# setting (cuBLAS, no autotuning) made the Flash-dLLM step 19% slower at
# batch 1 (15.43 ms). Is cuBLASLt's heuristic row-invariant and faster?
# GPU 1: the row probe for that flag set beside the shipped one, then the
# step with it. GPU 0: the quality table on the GPU (256 problems, both
# lengths, the block_m 64 variants), then the batch-32 step with one key
# split (--split-target 96).
gemm() {
  (export CUDA_VISIBLE_DEVICES=1
   timeout 200 python scripts/probe_batch_invariance.py --sets 4 7 \
       > "$OUT/probe_gemm.log" 2>&1
   XLA_FLAGS=--xla_gpu_enable_cublaslt=true timeout 200 \
       python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1 \
       --gen 512 --only flash-dllm --batch 1 32 --json "$OUT/step_lt.json" \
       > "$OUT/step_lt.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 240 python scripts/eval_quality.py \
      --limit 256 --no-progress --out-dir "$OUT/q64" --strategies llada \
      threshold flash-cache flash-dllm flash-cache:block_m=64 \
      flash-dllm:block_m=64 > "$OUT/q64.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 150 python scripts/bench_strategies.py \
      --prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm \
      --batch 32 --split-target 96 --json "$OUT/step_split96.json" \
      > "$OUT/step_split96.log" 2>&1
  wait
}
