# Stage 's8after' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s8after
# s8after (eighth session, call 4): where the Flash-dLLM step's time goes with the new
# defaults (kernel profile, gen 512, batch 32 and 1), and the Flash-Cache
# step (the draft pass alone) with its steady step.
s8after() {
  set -o pipefail
  timeout 200 python scripts/profile_step.py --only flash-dllm --batch 32 1 \
      --gen 512 --per-step 8 --top 25 --out-dir "$OUT/prof" 2>&1 | tee "$OUT/prof.log"
  timeout 300 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-cache --batch 32 1 --steady \
      --json "$OUT/cache_step.json" 2>&1 | tee "$OUT/cache_step.log"
}
