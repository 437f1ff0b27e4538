# Stage 's7last' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s7last
# s7last (seventh session, 2 GPUs, <= 6 minutes): what s7step could not do.
# GPU 0: the Flash-dLLM step at gen 512 with cuBLASLt GEMMs (s7step's try
# failed on a bug in the new --gpu-option), then training on the GPU through
# the RMSNorm kernel's custom gradient (smoke run, one GPU, then data=2).
# GPU 1: the LLaDA sampler at batch 32, gen 512 (s7step's 200 s cap cut it).
s7last() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  (CUDA_VISIBLE_DEVICES=1 timeout 330 $s --batch 32 --gen 512 --only llada \
       --json "$OUT/llada32_512.json" > "$OUT/llada32_512.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 200 $s --batch 1 32 --gen 512 \
      --only flash-dllm --gpu-option xla_gpu_enable_cublaslt=true \
      --json "$OUT/step_lt.json" > "$OUT/step_lt.log" 2>&1
  (export CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.3
   timeout 60 python scripts/train_tiny.py --smoke --out runs/smoke_gpu \
       > "$OUT/train_smoke.log" 2>&1
   export CUDA_VISIBLE_DEVICES=0,1
   timeout 60 python scripts/train_tiny.py --smoke --mesh data=2 \
       --out runs/smoke_gpu2 > "$OUT/train_smoke_data2.log" 2>&1)
  wait
  mkdir -p "$OUT/p" && mv "$OUT"/*.log "$OUT"/*.json "$OUT/p/" 2>/dev/null
  cp "$OUT/p/suite.log" "$OUT/" 2>/dev/null
  tar -czf "$OUT/last.tgz" -C "$OUT" p && rm -r "$OUT/p"
}
