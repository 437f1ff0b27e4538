# Stage 'cells' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR cells
# cells (fifth session, 2 GPUs, <= 7 minutes): the baselines' batch-32 rows
# issue 4's table still lacks. The LLaDA sampler runs the same uncached
# forward of the whole sequence at every step whatever it commits, so its
# step is timed with 32 commits per step (16 steps at gen 512, not 128);
# Fast-dLLM prefix refreshes at each block start, so it keeps 4 per step.
# GPU 0: LLaDA sampler, then Fast-dLLM prefix. GPU 1: Elastic-Cache.
cells() {
  local s="python scripts/bench_strategies.py --prompt 768 --reps 1 --batch 32"
  (CUDA_VISIBLE_DEVICES=1 timeout 330 $s --per-step 4 --gen 512 256 \
       --only elastic-cache --json "$OUT/elastic32.json" \
       > "$OUT/elastic32.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 150 $s --per-step 32 --gen 256 512 \
      --only llada --json "$OUT/llada32.json" > "$OUT/llada32.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 210 $s --per-step 4 --gen 256 512 \
      --only fast-dllm-prefix --json "$OUT/prefix32.json" \
      > "$OUT/prefix32.log" 2>&1
  wait
}
