#!/usr/bin/env bash
# BENCHMARKS.md "Batch invariance" and "Continuous batching" (2 GPUs): the GEMM row and column probes, continuous against static
# batching, and the shipped model's token ids, steps and forwards under
# --mesh model=2 and data=2 against one GPU's.
source "$(dirname "$0")/common.sh"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
(CUDA_VISIBLE_DEVICES=0 python tools/probe_batch_invariance.py \
     > "$OUT/gemm-rows.md" 2>&1
 CUDA_VISIBLE_DEVICES=0 python tools/probe_column_invariance.py \
     > "$OUT/gemm-columns.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 python scripts/bench_continuous.py --problems 256 \
     --slots 32 --gen-length 256 --max-refills 4 \
     --json "$OUT/continuous.json" > "$OUT/continuous.log" 2>&1) &
wait
Q="python scripts/eval_quality.py --limit 128 --gen-lengths 192 --no-progress \
    --strategies llada fast-dllm-dual elastic-cache flash-cache flash-dllm"
CUDA_VISIBLE_DEVICES=0 $Q --out-dir "$OUT/q-none" > "$OUT/q-none.log" 2>&1
for m in model=2 data=2; do
  $Q --mesh $m --out-dir "$OUT/q-$m" > "$OUT/q-$m.log" 2>&1
  python scripts/compare_runs.py "$OUT/q-none" "$OUT/q-$m" \
      --fields token_ids steps forwards > "$OUT/tokens-${m/=/}.log" 2>&1
done
tail -n 3 "$OUT"/tokens-*.log "$OUT/continuous.log"
