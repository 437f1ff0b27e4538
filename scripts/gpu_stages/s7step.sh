# Stage 's7step' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s7step
# s7step (seventh session, 2 GPUs, <= 9.5 minutes): issue 4's step times.
# GPU 0: the Flash-dLLM and Flash-Cache step at gen 512 with the norms in
# the fixed-order kernel, then Flash-dLLM with cuBLASLt GEMMs added to the
# decode loop's compiler options (row-invariant at every probed M in the
# fifth session; an XLA_FLAGS entry may not reach a compile with options).
# GPU 1: the cells never measured: Fast-dLLM prefix and Elastic-Cache at
# batch 1 gen 256, the LLaDA sampler at batch 32 (gen 256, then 512).
s7step() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  (export CUDA_VISIBLE_DEVICES=1
   timeout 150 $s --batch 1 --gen 256 --only fast-dllm-prefix elastic-cache \
       --json "$OUT/cells_b1.json" > "$OUT/cells_b1.log" 2>&1
   timeout 180 $s --batch 32 --gen 256 --only llada \
       --json "$OUT/llada32_256.json" > "$OUT/llada32_256.log" 2>&1
   timeout 200 $s --batch 32 --gen 512 --only llada \
       --json "$OUT/llada32_512.json" > "$OUT/llada32_512.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 270 $s --batch 1 32 --gen 512 \
      --only flash-dllm flash-cache --json "$OUT/step.json" \
      > "$OUT/step.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 250 $s --batch 1 32 --gen 512 \
      --only flash-dllm --gpu-option xla_gpu_enable_cublaslt=true \
      --json "$OUT/step_lt.json" > "$OUT/step_lt.log" 2>&1
  wait
  mkdir -p "$OUT/p" && mv "$OUT"/*.log "$OUT"/*.json "$OUT/p/" 2>/dev/null
  cp "$OUT/p/suite.log" "$OUT/" 2>/dev/null
  tar -czf "$OUT/step.tgz" -C "$OUT" p && rm -r "$OUT/p"
}
