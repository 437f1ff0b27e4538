# Stage 's8tile' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s8tile
# s8tile (eighth session, call 2): what the call-1 profile pointed at, Flash-dLLM gen 512
# (per-step 8), batch 32 then 1; every variant without XLA's dot merger
# (which concatenated k_proj and v_proj weights every layer and pass):
#   C: one key split, up to 128 rows per program (fused mass, no combine)
#   A: the merger alone      B: one key split      D: 128-row tiles
s8tile() {
  set -o pipefail
  P="python scripts/profile_step.py --only flash-dllm --batch 32 1 --gen 512 \
      --per-step 8 --top 12 --gpu-option xla_gpu_dot_merger_threshold_mb=0"
  timeout 150 $P --label C- --split-target 1 --attention-max-block-r 128 \
      --out-dir "$OUT/C" 2>&1 | tee "$OUT/C.log"
  timeout 120 $P --label A- --out-dir "$OUT/A" 2>&1 | tee "$OUT/A.log"
  timeout 120 $P --label B- --split-target 1 --out-dir "$OUT/B" 2>&1 | tee "$OUT/B.log"
  timeout 120 $P --label D- --attention-max-block-r 128 --out-dir "$OUT/D" 2>&1 | tee "$OUT/D.log"
}
