# Stage 's7probe' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s7probe
# s7probe (seventh session, 2 GPUs, <= 9 minutes): stage tpprobe (where does
# a Flash-Cache decode under model=2 first differ from one GPU's, on the
# shipped model) and, sharing GPU 1 meanwhile, issue 6's quality table at
# gen 512 over all 1000 held-out problems (the strategies of quality3).
s7probe() {
  source scripts/gpu_stages/tpprobe.sh
  local s="llada threshold fast-dllm-prefix fast-dllm-dual elastic-cache \
      flash-cache flash-dllm flash-cache:block_m=32 flash-dllm:block_m=32 \
      flash-cache:block_m=64 flash-dllm:block_m=64 flash-cache:block_m=128 \
      flash-dllm:block_m=128"
  (sleep 20; CUDA_VISIBLE_DEVICES=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 \
       timeout 480 python scripts/eval_quality.py --limit 1000 --no-progress \
       --out-dir runs/q1000_512 --gen-lengths 512 --strategies $s \
       > "$OUT/q_512.log" 2>&1
   tar -czf "$OUT/q_512.tgz" -C runs q1000_512) &
  XLA_PYTHON_CLIENT_PREALLOCATE=false tpprobe
  # The previous model's differing problem was 49; also the largest bucket.
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python \
      scripts/probe_row_invariance.py --limit 128 --batch 128 --sub 128 \
      --sub-mesh model=2 --json "$OUT/probe_tp_big.json" \
      > "$OUT/probe_tp_big.log" 2>&1
  wait
  mkdir -p "$OUT/p" && mv "$OUT"/*.log "$OUT"/*.json "$OUT/p/" 2>/dev/null
  cp "$OUT/p/suite.log" "$OUT/" 2>/dev/null
  tar -czf "$OUT/tpprobe.tgz" -C "$OUT" p && rm -r "$OUT/p"
}
