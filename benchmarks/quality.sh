#!/usr/bin/env bash
# BENCHMARKS.md "Quality": every strategy, and Flash-dLLM's rule options, on
# the held-out synthetic problems at gen 192 and 256; four processes sharing
# the GPUs, a fifth of one's memory each (about 3.5 minutes on one H200).
#   CHECKPOINT=DIR LIMIT=N bash benchmarks/quality.sh OUT_DIR
# (defaults: the shipped model, 1000 problems).
source "$(dirname "$0")/common.sh"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
ckpt=${CHECKPOINT:-}
groups=("llada threshold fast-dllm-prefix fast-dllm-dual elastic-cache"
        "flash-cache flash-dllm flash-cache-confident flash-dllm-confident flash-dllm:end_rule=first flash-dllm:rank=mass")
names=(base flash)
gpu=0
for len in 192 256; do
  for i in 0 1; do
    name=quality-${LIMIT:-1000}-gen$len-${names[$i]}
    (CUDA_VISIBLE_DEVICES=$gpu ${PYTHON:-python} scripts/eval_quality.py \
         ${ckpt:+--checkpoint $ckpt} --limit ${LIMIT:-1000} --gen-lengths $len \
         --strategies ${groups[$i]} --no-progress --out-dir "$OUT/$name" \
         > "$OUT/$name.log" 2>&1) &
    gpu=$(( (gpu + 1) % (NGPU > 0 ? NGPU : 1) ))
  done
done
wait
tar -cJf "$OUT/records.tar.xz" -C "$OUT" $(cd "$OUT" && ls -d quality-*/)
grep -h "^|" "$OUT"/quality-*/*.md | sort -u
