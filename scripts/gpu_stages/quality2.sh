# Stage 'quality2' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR quality2
# quality2 (sixth session, 2 GPUs, <= 6 minutes): issue 6's quality table
# for the fresh-data model (train2a + train2b) over the first 256 held-out
# problems: every strategy plus the 64-position Flash windows. GPU 0: gen
# 256; GPU 1: gen 128, then 192 (gen 128 cannot hold 39 of the 256
# reference solutions, which need 129-157 tokens). Run directories come
# back as one tarball per GPU.
quality2() {
  local s="llada threshold fast-dllm-prefix fast-dllm-dual elastic-cache \
      flash-cache flash-dllm flash-cache:block_m=64 flash-dllm:block_m=64"
  (CUDA_VISIBLE_DEVICES=1 timeout 320 python scripts/eval_quality.py \
       --limit 256 --no-progress --out-dir runs/q2 --gen-lengths 128 192 \
       --strategies $s > "$OUT/q_128_192.log" 2>&1
   tar -czf "$OUT/q_128_192.tgz" -C runs q2) &
  CUDA_VISIBLE_DEVICES=0 timeout 320 python scripts/eval_quality.py \
      --limit 256 --no-progress --out-dir runs/q3 --gen-lengths 256 \
      --strategies $s > "$OUT/q_256.log" 2>&1
  tar -czf "$OUT/q_256.tgz" -C runs q3
  wait
}
