# Stage 'quality3' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR quality3
# quality3 (sixth session, 2 GPUs, <= 6 minutes): issue 6's quality table
# for the fresh-data model over ALL 1000 held-out problems (256 leave a
# 1-point target within 3 problems' noise), every strategy plus Flash
# windows of 32, 64 and 128 positions. Compiling dominates (execution is
# 1-2 s per run), so three processes share the 2 GPUs, one per length,
# each with a third of a GPU's memory. Run directories come back as one
# tarball per length.
quality3() {
  local s="llada threshold fast-dllm-prefix fast-dllm-dual elastic-cache \
      flash-cache flash-dllm flash-cache:block_m=32 flash-dllm:block_m=32 \
      flash-cache:block_m=64 flash-dllm:block_m=64 flash-cache:block_m=128 \
      flash-dllm:block_m=128"
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.3
  local gpu=(0 1 1) len=(256 192 128) i
  for i in 0 1 2; do
    (CUDA_VISIBLE_DEVICES=${gpu[$i]} timeout 330 python \
         scripts/eval_quality.py --limit 1000 --no-progress \
         --out-dir runs/q1000_${len[$i]} --gen-lengths ${len[$i]} \
         --strategies $s > "$OUT/q_${len[$i]}.log" 2>&1
     tar -czf "$OUT/q_${len[$i]}.tgz" -C runs q1000_${len[$i]}) &
  done
  wait
}
