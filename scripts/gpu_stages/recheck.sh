# Stage 'recheck' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR recheck
# recheck (third 2026-11-30 session, after `verify` and `train`): the
# retrained default model's continuous-vs-static and 1-GPU-vs-data=2 answers
# with the fixed-order mass sum (44cc9b6); its missing gen-256 quality rows;
# Elastic-Cache at batch 32; the GPU-marked kernel tests (row alone vs batch
# 128); whether XLA:CPU of jax 0.11 knows the option 36d84ee passes.
recheck() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada flash-cache flash-dllm --no-progress"
  (export CUDA_VISIBLE_DEVICES=0
   JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 \
       python -m pytest -q -m gpu -p no:cacheprovider \
       tests/test_kernel_attention.py
   JAX_PLATFORMS=cpu timeout 60 python -m pytest -q -p no:cacheprovider \
       tests/test_batch_invariance.py
   timeout 130 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
       --reps 1 --batch 32 --gen 512 --only elastic-cache \
       --json "$OUT/strategies_elastic.json"
  ) > "$OUT/gpu0.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 120 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
   timeout 110 python scripts/eval_quality.py --limit 256 --gen-lengths 256 \
       --strategies flash-cache flash-dllm --no-progress \
       --out-dir "$OUT/quality256" > "$OUT/quality256.log" 2>&1
  ) > "$OUT/gpu1.log" 2>&1
  wait
  (CUDA_VISIBLE_DEVICES=0 timeout 60 $q --out-dir "$OUT/q_none" \
       > "$OUT/q_none.log" 2>&1)
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data=2" > "$OUT/q_d.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data=2" \
      > "$OUT/mesh_tokens.log" 2>&1
}
