# Stage 'excess' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR excess
# excess (next session, one call on 2 GPUs, <= 8 minutes): the GPU test of
# a row alone vs a batch of 128 (the recheck stage's cap cut it), the row
# probe on the still-open data=2 difference of the Flash-Cache paths, and
# their answers with and without XLA:GPU's excess precision (a fusion may
# skip a bf16 round trip).
excess() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false \
      timeout 150 python -m pytest -q -m gpu -p no:cacheprovider \
      -k row_does_not_depend tests/test_kernel_attention.py \
      > "$OUT/gpu_tests.log" 2>&1
  # Which step and which model piece first differ: 128 rows on one GPU
  # against the same rows over data=2 (the failing setup), default flags.
  timeout 180 python scripts/probe_row_invariance.py --sub 128 \
      --sub-mesh data=2 --xla-note default --json "$OUT/probe_data2.json" \
      > "$OUT/probe_data2.log" 2>&1
  for flags in "" "--xla_allow_excess_precision=false"; do
    local tag=${flags:+noexcess}; tag=${tag:-default}
    XLA_FLAGS="$flags" CUDA_VISIBLE_DEVICES=0 timeout 60 $q \
        --out-dir "$OUT/q_none_$tag" > "$OUT/q_none_$tag.log" 2>&1
    XLA_FLAGS="$flags" timeout 60 $q --mesh data=2 \
        --out-dir "$OUT/q_data2_$tag" > "$OUT/q_data2_$tag.log" 2>&1
    echo "XLA_FLAGS=$flags" >> "$OUT/mesh_tokens.log"
    python scripts/compare_runs.py "$OUT/q_none_$tag" "$OUT/q_data2_$tag" \
        >> "$OUT/mesh_tokens.log" 2>&1
  done
}
