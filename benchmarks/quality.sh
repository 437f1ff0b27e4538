#!/usr/bin/env bash
# BENCHMARKS.md "Quality": every strategy on all 1000 held-out synthetic
# problems at gen 192 and 256, and the Flash windows 32-128; four
# processes per GPU, a fifth of its memory each.
#   CHECKPOINT=DIR LIMIT=N bash benchmarks/quality.sh OUT_DIR
# (defaults: the shipped model, 1000 problems).
source "$(dirname "$0")/common.sh"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
ckpt=${CHECKPOINT:-}
groups=("llada flash-cache flash-dllm"
        "threshold fast-dllm-prefix fast-dllm-dual elastic-cache"
        "flash-cache:block_m=32 flash-dllm:block_m=32 flash-cache:block_m=64 flash-dllm:block_m=64 flash-cache:block_m=128 flash-dllm:block_m=128")
names=(a b windows)
gpu=0
for len in 192 256; do
  for i in 0 1 2; do
    name=quality-${LIMIT:-1000}-gen$len-${names[$i]}
    (CUDA_VISIBLE_DEVICES=$gpu python scripts/eval_quality.py \
         ${ckpt:+--checkpoint $ckpt} --limit ${LIMIT:-1000} --gen-lengths $len \
         --strategies ${groups[$i]} --no-progress --out-dir "$OUT/$name" \
         > "$OUT/$name.log" 2>&1) &
    gpu=$(( (gpu + 1) % (NGPU > 0 ? NGPU : 1) ))
  done
done
wait
tar -czf "$OUT/records.tgz" -C "$OUT" $(cd "$OUT" && ls -d quality-*/)
grep -h "^|" "$OUT"/quality-*/*.md | sort -u
