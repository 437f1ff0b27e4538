# Stage 's10quality' of scripts/bench_suite.sh (sourced there: OUT is set,
# the working directory is the repository root). Issue 6's quality table:
# the seven strategies on all 1000 held-out problems at gen 192 and 256, as
# four processes (two per GPU, a fifth of its memory each), about a minute.
#   CHECKPOINT=DIR bash scripts/bench_suite.sh OUT_DIR s10quality
# (default: the shipped model). OUT gets q10.tgz: runs/q10_{192,256}_{a,b}
# (tables and per-problem records) and their logs.
s10quality() {
  mkdir -p runs
  local ckpt=${CHECKPOINT:-} len half gpu=0 args
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
  for len in 192 256; do
    for half in a b; do
      if [ $half = a ]; then args="llada flash-cache flash-dllm"
      else args="threshold fast-dllm-prefix fast-dllm-dual elastic-cache"; fi
      (CUDA_VISIBLE_DEVICES=$gpu timeout 150 python scripts/eval_quality.py \
           ${ckpt:+--checkpoint $ckpt} --limit ${LIMIT:-1000} --gen-lengths $len \
           --strategies $args --no-progress --out-dir runs/q10_${len}_$half \
           > runs/q10_${len}_$half.log 2>&1) &
      gpu=$(( (gpu + 1) % (NGPU > 0 ? NGPU : 1) ))
    done
  done
  wait
  tar -czf "$OUT/q10.tgz" -C runs q10_192_a q10_192_b q10_256_a q10_256_b \
      q10_192_a.log q10_192_b.log q10_256_a.log q10_256_b.log
  grep -h "^|" runs/q10_*/*.md 2>/dev/null | sort -u | head -40
}
