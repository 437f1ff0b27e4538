# Stage 's9check' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s9check     # about 5 minutes, 2 GPUs
# Ninth session, after the model trained on varied phrasing became the
# shipped default: (GPU 0) the Flash windows of issue 6's table (block_m 32,
# 64, 128) on all 1000 held-out problems at gen 192 and 256; (GPU 1)
# continuous vs static batching's answers and tokens/s; then the five
# strategies' token ids, steps and forwards with no mesh, model=2 and data=2.
s9check() {
  mkdir -p runs
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
  local s="flash-cache:block_m=32 flash-dllm:block_m=32 \
      flash-cache:block_m=64 flash-dllm:block_m=64 flash-cache:block_m=128 \
      flash-dllm:block_m=128" len
  for len in 192 256; do
    (CUDA_VISIBLE_DEVICES=0 timeout 240 python scripts/eval_quality.py \
         --limit 1000 --no-progress --out-dir runs/qw_$len \
         --gen-lengths $len --strategies $s > runs/qw_$len.log 2>&1) &
  done
  (CUDA_VISIBLE_DEVICES=1 timeout 200 python scripts/bench_continuous.py \
       --problems 256 --slots 32 --gen-length 256 --max-refills 4 \
       --json runs/continuous.json > runs/continuous.log 2>&1) &
  wait
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 192 \
      --strategies llada fast-dllm-dual elastic-cache flash-cache flash-dllm \
      --no-progress" m
  CUDA_VISIBLE_DEVICES=0 timeout 90 $q --out-dir runs/q_none \
      > runs/q_none.log 2>&1
  timeout 90 $q --mesh model=2 --out-dir runs/q_model2 > runs/q_model2.log 2>&1
  timeout 90 $q --mesh data=2 --out-dir runs/q_data2 > runs/q_data2.log 2>&1
  for m in model2 data2; do
    python scripts/compare_runs.py runs/q_none runs/q_$m \
        --fields token_ids steps forwards > runs/tokens_$m.log 2>&1
  done
  tar -czf "$OUT/s9check.tgz" -C runs qw_192 qw_256 qw_192.log qw_256.log \
      continuous.json continuous.log q_none q_model2 q_data2 q_none.log \
      q_model2.log q_data2.log tokens_model2.log tokens_data2.log
  tail -n 3 runs/tokens_*.log runs/continuous.log
}
