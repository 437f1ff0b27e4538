# Stage 'quality64' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR quality64
# quality64 (queued after the fourth session, 2 GPUs, <= 7 minutes): the
# quality table with Flash-dLLM's 64-position window on the GPU over 256
# problems at both lengths (on the CPU, 128 problems at gen 128: 1.88x
# threshold decoding's tokens per step), then, after the token kernel and
# the cuBLAS setting, whether data=2 still leaves the LLaDA sampler's and
# Fast-dLLM dual's answers unchanged.
quality64() {
  CUDA_VISIBLE_DEVICES=0 timeout 240 python scripts/eval_quality.py \
      --limit 256 --no-progress --out-dir "$OUT/q64" --strategies llada \
      threshold flash-cache flash-dllm flash-cache:block_m=64 \
      flash-dllm:block_m=64 > "$OUT/q64.log" 2>&1
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual --no-progress"
  CUDA_VISIBLE_DEVICES=0 timeout 60 $q --out-dir "$OUT/q_none" \
      > "$OUT/q_none.log" 2>&1
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data2" > "$OUT/q_data2.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data2" \
      > "$OUT/mesh_tokens.log" 2>&1
}
