# Stage 's8bf16' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s8bf16
# s8bf16 (eighth session, call 5; 5 minutes of device time left): linear layers
# without a bias ask XLA for the product in bf16 (cuBLAS accumulates in
# float32 and rounds once) instead of a float32 product and a convert.
#  1. the Flash-dLLM step at batch 32, gen 512, with its steady step;
#  2. the shipped model's records (64 problems, gen 192, five strategies)
#     against session 7's: they must stay identical to adopt it. As run,
#     the comparison found no run in both (run names hash --limit); it
#     now pairs such runs by strategy (compare_runs.py).
s8bf16() {
  set -o pipefail
  timeout 140 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm --batch 32 --steady \
      --json "$OUT/step_bf16.json" 2>&1 | tee "$OUT/step_bf16.log"
  mkdir -p runs/ref && tar -xzf benchmarks/results/2026-11-30-h200-session7/tp-records.tgz -C runs/ref
  timeout 110 python scripts/eval_quality.py --limit 64 --gen-lengths 192 \
      --no-progress --out-dir runs/q_bf16 --strategies llada fast-dllm-dual \
      elastic-cache flash-cache flash-dllm > "$OUT/q_bf16.log" 2>&1
  python scripts/compare_runs.py runs/ref/tp-records/none runs/q_bf16 \
      --fields token_ids steps forwards 2>&1 | tee "$OUT/identity_bf16.log"
}
