# Stage 'invariance' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR invariance
# invariance: which XLA flags make a row's matmul independent of the batch
# rows (scripts/probe_batch_invariance.py), then under the best set: the
# shipped model's answers with and without data parallelism, continuous
# batching, and the Flash-dLLM step times (the cost of those flags).
invariance() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  CUDA_VISIBLE_DEVICES=1 timeout 150 python scripts/probe_batch_invariance.py \
      > "$OUT/probe.md" 2>&1
  local flags; flags=$(grep '^BEST_FLAGS=' "$OUT/probe.md" | cut -d= -f2-)
  export XLA_FLAGS="$flags"
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512"
  # (On 2026-11-30 this stage also ran Flash-Cache at batch 32 with and
  # without the cuDNN split of commit 4bb1d87, reverted after that A/B.)
  (export CUDA_VISIBLE_DEVICES=0
   timeout 130 $s --batch 1 32 --only flash-dllm \
       --json "$OUT/strategies_flags.json"
  ) > "$OUT/strategies.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1
   timeout 100 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
  ) > "$OUT/gpu1.log" 2>&1
  wait
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data=2" > "$OUT/q_d.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data=2" \
      > "$OUT/mesh_tokens.log" 2>&1
}
