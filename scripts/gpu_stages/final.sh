# Stage 'final' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR final
# final (fourth session, 2 GPUs, <= 5 minutes): the confirm stage's probe
# found the next difference in a GEMM (L0 down_proj); decode loops now
# compile with cuBLAS GEMMs on GPUs (generate.GPU_COMPILER_OPTIONS). GPU 1:
# the Flash-dLLM step so compiled; GPU 0 and then both: answers alone vs
# data=2.
final() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  CUDA_VISIBLE_DEVICES=1 timeout 230 python scripts/bench_strategies.py \
      --prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm \
      --batch 1 32 --json "$OUT/perf.json" > "$OUT/perf.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=0 timeout 70 $q --out-dir "$OUT/q_none" \
      > "$OUT/q_none.log" 2>&1
  wait
  timeout 70 $q --mesh data=2 --out-dir "$OUT/q_data2" > "$OUT/q_data2.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data2" \
      > "$OUT/mesh_tokens.log" 2>&1
}
