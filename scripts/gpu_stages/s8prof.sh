# Stage 's8prof' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s8prof
# s8prof (eighth session, call 1): kernel profile of the Flash-dLLM step (gen 512, LLaDA-8B
# shapes, random weights), batch 1 and 32, and of Flash-Cache at batch 32.
s8prof() {
  set -o pipefail
  python scripts/profile_step.py --only flash-dllm flash-cache --batch 32 1 \
      --gen 512 --per-step 8 --keep-trace --out-dir "$OUT" 2>&1 | tee "$OUT/prof.log"
}
