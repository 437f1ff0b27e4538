#!/usr/bin/env bash
# The quality table (BENCHMARKS.md "Quality"): every strategy on the held-out
# synthetic problems at gen 192 and 256, as four processes sharing the GPUs.
#   bash benchmarks/quality.sh OUT_DIR [LIMIT]     # about 4 minutes on one H200
# OUT_DIR gets quality.tgz (tables, per-problem records, logs).
set -u
OUT=${1:?usage: benchmarks/quality.sh OUT_DIR [LIMIT]}
LIMIT=${2:-1000}
cd "$(dirname "$0")/.."
mkdir -p "$OUT" runs
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
BASE="llada threshold fast-dllm-prefix fast-dllm-dual elastic-cache"
FLASH="flash-cache flash-dllm flash-cache-confident flash-dllm-confident
       flash-dllm-first flash-dllm-mass"
gpu=0
for len in 192 256; do
  for part in base flash; do
    if [ $part = base ]; then names=$BASE; else names=$FLASH; fi
    (CUDA_VISIBLE_DEVICES=$gpu timeout ${CAP:-330} ${PYTHON:-python} scripts/eval_quality.py \
         --limit "$LIMIT" --gen-lengths $len --strategies $names --no-progress \
         --out-dir runs/quality_${len}_$part > runs/quality_${len}_$part.log 2>&1) &
    gpu=$(( (gpu + 1) % (NGPU > 0 ? NGPU : 1) ))
  done
done
wait
tar -czf "$OUT/quality.tgz" -C runs quality_192_base quality_192_flash \
    quality_256_base quality_256_flash quality_192_base.log \
    quality_192_flash.log quality_256_base.log quality_256_flash.log
grep -h "^|" runs/quality_*/quality.md 2>/dev/null
