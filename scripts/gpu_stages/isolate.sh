# Stage 'isolate' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR isolate
# isolate (fourth session, 2 GPUs, <= 9.5 minutes): the excess stage found
# the data=2 difference only in a 17-row bucket (problems 18 and 92), which
# data=2 pads to 9 rows per GPU; excess precision was not the cause. Probe
# that bucket; answers under two GEMM flags; and, on GPU 1 alone first, the
# batch-32 Flash-dLLM step with cuBLAS GEMMs and with one key split (96).
isolate() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  local flags=(--xla_gpu_enable_split_k_autotuning=false
               --xla_gpu_enable_triton_gemm=false)
  (export CUDA_VISIBLE_DEVICES=1
   timeout 80 $s --batch 32 --json "$OUT/perf_default.json"
   XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 110 $s --batch 1 32 \
       --json "$OUT/perf_cublas.json"
   timeout 80 $s --split-target 96 --batch 32 --json "$OUT/perf_split96.json"
  ) > "$OUT/perf.log" 2>&1 &
  for f in "${flags[@]}"; do
    XLA_FLAGS="$f" CUDA_VISIBLE_DEVICES=0 timeout 50 $q \
        --out-dir "$OUT/q_none_${f:6:12}" > "$OUT/q_none_${f:6:12}.log" 2>&1
  done
  wait
  timeout 150 python scripts/probe_row_invariance.py --limit 128 \
      --bucket-with 18 --batch 128 --sub 128 --sub-mesh data=2 \
      --xla-note "17-row bucket" --json "$OUT/probe_b17.json" \
      > "$OUT/probe_b17.log" 2>&1
  for f in "${flags[@]}"; do
    XLA_FLAGS="$f" timeout 55 $q --mesh data=2 \
        --out-dir "$OUT/q_data2_${f:6:12}" > "$OUT/q_data2_${f:6:12}.log" 2>&1
    echo "XLA_FLAGS=$f" >> "$OUT/mesh_tokens.log"
    python scripts/compare_runs.py "$OUT/q_none_${f:6:12}" \
        "$OUT/q_data2_${f:6:12}" >> "$OUT/mesh_tokens.log" 2>&1
  done
}
