# Stage 'tpprobe' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR tpprobe
# tpprobe (next session, 2 GPUs, <= 6 minutes): under model=2 the LLaDA
# sampler and Fast-dLLM dual give one GPU's tokens and step counts, but
# Flash-Cache changes the step count of problems 9 and 49 and Flash-dLLM of
# 15, 50 and 64 (fifth session, stage tp). The row probe runs the same rows
# without a mesh and over model=2 and reports the first differing step and
# model piece (query slots, per-layer projections, kernel out and mass,
# logits, confidences). Then the column probe at every decode row count of
# the 8B benchmark (128 / 4096 draft rows, 1280 / 40960 prefill rows), and
# the GPU test of the kernel on a head shard (global key splits, per-head
# mass) against the whole call, bit for bit.
tpprobe() {
  # First, one GPU each: the kernel on a head shard against one device
  # (Triton) on GPU 1, the column probe on GPU 0. Then the row probe on both.
  (export CUDA_VISIBLE_DEVICES=1 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_attention.py -k head_shard \
       > "$OUT/gpu_head_shard.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 150 python scripts/probe_column_invariance.py \
      > "$OUT/probe_columns.log" 2>&1
  wait
  timeout 200 python scripts/probe_row_invariance.py --limit 128 \
      --bucket-with 49 --batch 128 --sub 128 --sub-mesh model=2 \
      --json "$OUT/probe_tp_49.json" > "$OUT/probe_tp_49.log" 2>&1
}
