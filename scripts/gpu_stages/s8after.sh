# Session 8, call 4: where the Flash-dLLM step's time goes with the new
# defaults (kernel profile, gen 512, batch 32 and 1), and the Flash-Cache
# step (the draft pass alone) with its steady step.
set -o pipefail
export PYTHONUNBUFFERED=1
timeout 200 python scripts/profile_step.py --only flash-dllm --batch 32 1 \
    --gen 512 --per-step 8 --top 25 --out-dir "$OUT/prof" 2>&1 | tee "$OUT/prof.log"
timeout 300 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
    --reps 1 --gen 512 --only flash-cache --batch 32 1 --steady \
    --json "$OUT/cache_step.json" 2>&1 | tee "$OUT/cache_step.log"
