# Stage 's8check' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s8check
# s8check (eighth session, call 3): the new defaults (no dot merger, key splits only below
# 32 programs per sequence, the Flash-Cache mass on its window rows alone).
#  1. GPU tests of the kernels (new: score_prefix at LLaDA-8B's shapes) and
#     the shipped model's decodes of 128 problems (gen 192, five strategies)
#     against session 7's records: token ids, steps and forwards;
#  2. then alone on the GPU: the Flash-dLLM step at gen 512 (issue 4's
#     targets), with the steady step (without the prefill) measured too.
s8check() {
  set -o pipefail
  (XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 JAX_PLATFORMS=cuda timeout 200 \
      python -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_kernel_attention.py tests/test_kernel_rms_norm.py \
      tests/test_kernel_token_logprob.py > "$OUT/gpu_tests.log" 2>&1) &
  mkdir -p runs/ref && tar -xzf benchmarks/results/2026-11-30-h200-session7/tp-records.tgz -C runs/ref
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 200 python scripts/eval_quality.py \
      --limit 128 --gen-lengths 192 --no-progress --out-dir runs/q_new \
      --strategies llada fast-dllm-dual elastic-cache flash-cache flash-dllm \
      > "$OUT/q_new.log" 2>&1
  python scripts/compare_runs.py runs/ref/tp-records/none runs/q_new \
      --fields token_ids steps forwards 2>&1 | tee "$OUT/identity.log"
  wait
  tail -3 "$OUT/gpu_tests.log"
  timeout 330 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm --batch 32 1 --steady \
      --json "$OUT/step.json" 2>&1 | tee "$OUT/step.log"
}
