#!/usr/bin/env bash
# Every GPU benchmark in one call on a host with 2 GPUs (one GPU works too:
# the mesh stage is then skipped). Stages are time-capped so a slow one
# cannot eat the others; each script prints its rows as it measures them.
#
#   bash scripts/bench_suite.sh OUT_DIR single   # <= 9 minutes on 2 x H200
#   bash scripts/bench_suite.sh OUT_DIR mesh     # <= 3.5 minutes
#   bash scripts/bench_suite.sh OUT_DIR          # both: over one call's 10 min
#   bash scripts/bench_suite.sh OUT_DIR followup # <= 6 minutes (see below)
#   bash scripts/bench_suite.sh OUT_DIR invariance # <= 6 minutes
#   bash scripts/bench_suite.sh OUT_DIR verify   # <= 7 minutes
#   bash scripts/bench_suite.sh OUT_DIR train    # <= 10 minutes (issue 6)
#   bash scripts/bench_suite.sh OUT_DIR recheck  # <= 7 minutes
#   bash scripts/bench_suite.sh OUT_DIR excess   # <= 8 minutes
#   bash scripts/bench_suite.sh OUT_DIR isolate  # <= 9.5 minutes
#   bash scripts/bench_suite.sh OUT_DIR confirm  # <= 9.7 minutes
#   bash scripts/bench_suite.sh OUT_DIR final    # <= 5 minutes
#   bash scripts/bench_suite.sh OUT_DIR step     # <= 8 minutes (next)
#
# OUT_DIR gets more files than a device call brings back: tar it.
#
# single, in parallel: kernels and the GPU tests on GPU 1 (on GPU 0 after
# the strategies when there is one GPU), strategies on GPU 0. mesh: the
# two-GPU data- and tensor-parallel benchmark.
set -u
OUT=${1:?usage: bench_suite.sh OUT_DIR [single|mesh|all]}
STAGE=${2:-all}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $NGPU" | tee "$OUT/suite.log"

kernels() {
  local k="python scripts/bench_kernels.py"
  # The shapes earlier runs left unmeasured (2026-11-30: Dream attention at
  # Q = 32/128, the LLaDA down projection and every Dream matmul), then a
  # tiling sweep where the default tiles lost to cuDNN (LLaDA Q = 128).
  timeout 300 $k "$OUT/kernels_rest.json" \
      --skip-done benchmarks/results/2026-11-30-h200-kernels-*.json
  timeout 120 $k "$OUT/kernels_tune.json" --tune --tune-limit 12 --reps 5 \
      --inner 20 --ops attention \
      --match '^attention llada B=(8|32) S=2048 Q=128 '
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_gpu_integration.py tests/test_ops_attention.py
}

strategies() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  timeout 150 $s --batch 1 32 --gen 512 --json "$OUT/strategies_verify.json" \
      --only flash-dllm
  timeout 180 $s --batch 1 32 --gen 256 --json "$OUT/strategies_256.json" \
      --only flash-dllm flash-cache fast-dllm-dual elastic-cache
  timeout 90 $s --batch 1 --gen 512 --json "$OUT/strategies_b1.json" \
      --only llada fast-dllm-prefix elastic-cache
}

# followup (2026-11-30, second session; run then with the cuDNN split of
# 4bb1d87, reverted since): batch-32 steps, the kernel shapes the first stage had no
# time for, the GPU test of that split, continuous batching on the GPU, and
# whether a mesh changes the shipped model's answers.
followup() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  (CUDA_VISIBLE_DEVICES=0 timeout 170 $s --batch 32 --gen 512 \
      --json "$OUT/strategies_split.json" --only flash-dllm flash-cache \
      > "$OUT/strategies.log" 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 90 python scripts/bench_kernels.py "$OUT/kernels_last.json" \
       --skip-done benchmarks/results/2026-11-30-h200-kernels-*.json
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 60 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_ops_attention.py
   timeout 150 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
  ) > "$OUT/gpu1.log" 2>&1
  wait
  for mesh in none model=2 data=2; do
    local m=""; [ "$mesh" != none ] && m="--mesh $mesh"
    timeout 90 $q $m --out-dir "$OUT/q_$mesh" > "$OUT/q_$mesh.log" 2>&1
  done
  for mesh in model=2 data=2; do
    python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_$mesh" \
        >> "$OUT/mesh_tokens.log" 2>&1
  done
}

# invariance: which XLA flags make a row's matmul independent of the batch
# rows (scripts/probe_batch_invariance.py), then under the best set: the
# shipped model's answers with and without data parallelism, continuous
# batching, and the Flash-dLLM step times (the cost of those flags).
invariance() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  CUDA_VISIBLE_DEVICES=1 timeout 150 python scripts/probe_batch_invariance.py \
      > "$OUT/probe.md" 2>&1
  local flags; flags=$(grep '^BEST_FLAGS=' "$OUT/probe.md" | cut -d= -f2-)
  export XLA_FLAGS="$flags"
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512"
  # (On 2026-11-30 this stage also ran Flash-Cache at batch 32 with and
  # without the cuDNN split of commit 4bb1d87, reverted after that A/B.)
  (export CUDA_VISIBLE_DEVICES=0
   timeout 130 $s --batch 1 32 --only flash-dllm \
       --json "$OUT/strategies_flags.json"
  ) > "$OUT/strategies.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1
   timeout 100 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
  ) > "$OUT/gpu1.log" 2>&1
  wait
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data=2" > "$OUT/q_d.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data=2" \
      > "$OUT/mesh_tokens.log" 2>&1
}

# verify (next session, first call): the GPU side of what the second
# 2026-11-30 session changed without device time left. GPU tests of the
# split merge kernel and of per-shard attention; answers of static vs
# continuous batching and of 1 GPU vs data=2 / model=2 (must now agree
# except model=2's reordered sums); the Flash-dLLM step with the
# batch-independent splits (its cost against 12.84 / 166.8 ms).
verify() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies llada fast-dllm-dual flash-dllm --no-progress"
  (export CUDA_VISIBLE_DEVICES=0
   JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 \
       python -m pytest -q -m gpu -p no:cacheprovider \
       tests/test_kernel_attention.py tests/test_ops_attention.py \
       tests/test_gpu_integration.py
   timeout 150 python scripts/bench_strategies.py --prompt 768 --per-step 4 \
       --reps 1 --batch 1 32 --gen 512 --only flash-dllm \
       --json "$OUT/strategies_verify.json"
  ) > "$OUT/gpu0.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=1
   timeout 120 python scripts/bench_continuous.py --problems 256 --slots 32 \
       --gen-length 256 --max-refills 4 --json "$OUT/continuous.json"
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1
  ) > "$OUT/gpu1.log" 2>&1
  wait
  for mesh in data=2 model=2; do
    timeout 60 $q --mesh $mesh --out-dir "$OUT/q_$mesh" > "$OUT/q_$mesh.log" 2>&1
    python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_$mesh" \
        >> "$OUT/mesh_tokens.log" 2>&1
  done
}

# train (issue 6, one call on 2 GPUs, <= 10 minutes): continue the shipped
# model from its weights for the 7.6 of the issue's 15 training minutes it
# has not used, then the quality table of the result. OUT gets the model
# and the tables; bring the model back with tar + split (files <= 16 MiB).
train() {
  python scripts/make_synthetic_gsm.py runs/synthetic_gsm --train 200000 \
      --test 1000 --ood 500 --seed 0 --workers 16 > "$OUT/train.log" 2>&1
  cmp runs/synthetic_gsm/test.jsonl data/synthetic_gsm/test.jsonl \
      >> "$OUT/train.log" 2>&1 || { echo "test split differs" >> "$OUT/train.log"; return 1; }
  python scripts/train_tiny.py --data runs/synthetic_gsm --out runs/train_warm \
      --mesh data=2 --init-from checkpoints/synthetic-gsm-llada-12m \
      --fit-to-time --max-minutes 6.0 --steps 100000 --lr 5e-4 \
      --warmup-steps 100 --eval-every 1000 --ckpt-every 100000 \
      --eval-problems 128 >> "$OUT/train.log" 2>&1
  timeout 150 python scripts/eval_quality.py --checkpoint runs/train_warm/model \
      --limit 256 --no-progress --out-dir "$OUT/quality" > "$OUT/quality.log" 2>&1
  cp -r runs/train_warm/model runs/train_warm/loss.png \
      runs/train_warm/metrics.jsonl "$OUT/"
}

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

# isolate (fourth session, 2 GPUs, <= 9.5 minutes): the excess stage found
# the data=2 difference only in a 17-row bucket (problems 18 and 92), which
# data=2 pads to 9 rows per GPU; excess precision was not the cause. Probe
# that bucket; answers under two GEMM flags; and, on GPU 1 alone first, the
# batch-32 Flash-dLLM step with cuBLAS GEMMs and with one key split (96).
isolate() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  local split96="import runpy, sys; import pallas_kernels.attention.kernel as k
k.default_splits.__defaults__ = (96,)
sys.argv = ['bench_strategies.py'] + sys.argv[1:]
runpy.run_path('scripts/bench_strategies.py', run_name='__main__')"
  local flags=(--xla_gpu_enable_split_k_autotuning=false
               --xla_gpu_enable_triton_gemm=false)
  (export CUDA_VISIBLE_DEVICES=1
   timeout 80 $s --batch 32 --json "$OUT/perf_default.json"
   XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 110 $s --batch 1 32 \
       --json "$OUT/perf_cublas.json"
   timeout 80 python -c "$split96" --prompt 768 --per-step 4 --reps 1 \
       --gen 512 --only flash-dllm --batch 32 --json "$OUT/perf_split96.json"
  ) > "$OUT/perf.log" 2>&1 &
  for f in "${flags[@]}"; do
    XLA_FLAGS="$f" CUDA_VISIBLE_DEVICES=0 timeout 50 $q \
        --out-dir "$OUT/q_none_${f:6:12}" > "$OUT/q_none_${f:6:12}.log" 2>&1
  done
  wait
  timeout 150 python scripts/probe_row_invariance.py --limit 128 \
      --bucket-with 18 --batch 128 --sub 128 --sub-mesh data=2 \
      --xla-note "17-row bucket" --json "$OUT/probe_b17.json" \
      > "$OUT/probe_b17.log" 2>&1
  for f in "${flags[@]}"; do
    XLA_FLAGS="$f" timeout 55 $q --mesh data=2 \
        --out-dir "$OUT/q_data2_${f:6:12}" > "$OUT/q_data2_${f:6:12}.log" 2>&1
    echo "XLA_FLAGS=$f" >> "$OUT/mesh_tokens.log"
    python scripts/compare_runs.py "$OUT/q_none_${f:6:12}" \
        "$OUT/q_data2_${f:6:12}" >> "$OUT/mesh_tokens.log" 2>&1
  done
}

# confirm (fourth session, 2 GPUs, <= 9.7 minutes): the isolate stage's probe
# found the first difference in a confidence (logits equal, the sum over the
# vocabulary in another order); ops.token_logprob now runs a fixed-order
# kernel. GPU 0: its GPU tests, then answers alone vs data=2 (the probe
# again only if they still differ). GPU 1 first: the Flash-dLLM step with
# the kernel, with cuBLAS GEMMs, and with cuBLAS and one key split.
confirm() {
  local s="python scripts/bench_strategies.py --prompt 768 --per-step 4 \
      --reps 1 --gen 512 --only flash-dllm"
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  local split96="import runpy, sys; import pallas_kernels.attention.kernel as k
k.default_splits.__defaults__ = (96,)
sys.argv = ['bench_strategies.py'] + sys.argv[1:]
runpy.run_path('scripts/bench_strategies.py', run_name='__main__')"
  local cublas=--xla_gpu_enable_triton_gemm=false
  (export CUDA_VISIBLE_DEVICES=1
   timeout 160 $s --batch 1 32 --json "$OUT/perf_default.json"
   XLA_FLAGS=$cublas timeout 160 python -c "$split96" --prompt 768 \
       --per-step 4 --reps 1 --gen 512 --only flash-dllm --batch 1 32 \
       --json "$OUT/perf_cublas_split96.json"
   XLA_FLAGS=$cublas timeout 120 $s --batch 32 --json "$OUT/perf_cublas.json"
  ) > "$OUT/perf.log" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_token_logprob.py \
       > "$OUT/gpu_tests.log" 2>&1
   timeout 60 $q --out-dir "$OUT/q_none" > "$OUT/q_none.log" 2>&1)
  wait
  timeout 60 $q --mesh data=2 --out-dir "$OUT/q_data2" > "$OUT/q_data2.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data2" \
      > "$OUT/mesh_tokens.log" 2>&1
  if grep -q differ "$OUT/mesh_tokens.log"; then
    timeout 90 python scripts/probe_row_invariance.py --limit 128 \
        --bucket-with 18 --batch 128 --sub 128 --sub-mesh data=2 \
        --xla-note "17-row bucket, kernel" --json "$OUT/probe_b17.json" \
        > "$OUT/probe_b17.log" 2>&1
  fi
}

# final (fourth session, 2 GPUs, <= 5 minutes): the confirm stage's probe
# found the next difference in a GEMM (L0 down_proj); decode loops now
# compile with cuBLAS GEMMs on GPUs (generate.GPU_COMPILER_OPTIONS). GPU 1:
# the Flash-dLLM step so compiled; GPU 0 and then both: answers alone vs
# data=2.
final() {
  local q="python scripts/eval_quality.py --limit 128 --gen-lengths 128 \
      --strategies flash-cache flash-dllm --no-progress"
  CUDA_VISIBLE_DEVICES=1 timeout 230 python scripts/bench_strategies.py \
      --prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm \
      --batch 1 32 --json "$OUT/perf.json" > "$OUT/perf.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=0 timeout 70 $q --out-dir "$OUT/q_none" \
      > "$OUT/q_none.log" 2>&1
  wait
  timeout 70 $q --mesh data=2 --out-dir "$OUT/q_data2" > "$OUT/q_data2.log" 2>&1
  python scripts/compare_runs.py "$OUT/q_none" "$OUT/q_data2" \
      > "$OUT/mesh_tokens.log" 2>&1
}

# step (next session, 2 GPUs, <= 8 minutes): no Flash-dLLM step at LLaDA-8B
# shapes finished within 160-230 s in the fourth session (the third
# session's took < 150 s for batch 1 and 32); the mass sum is now a tree of
# 7 adds, not a chain of 95. GPU 0 alone: the step, with progress lines.
# GPU 1: the kernel tests (the batch-128 row test, the new token kernel).
step() {
  (export CUDA_VISIBLE_DEVICES=1 JAX_PLATFORMS=cuda
   XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python -m pytest -q -m gpu \
       -p no:cacheprovider tests/test_kernel_attention.py \
       tests/test_kernel_token_logprob.py > "$OUT/gpu_tests.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=0 timeout 420 python scripts/bench_strategies.py \
      --prompt 768 --per-step 4 --reps 1 --gen 512 --only flash-dllm \
      flash-cache --batch 1 32 --json "$OUT/step.json" > "$OUT/step.log" 2>&1
  wait
}

case "$STAGE" in
  step|final|excess|isolate|confirm|recheck|train|verify|invariance|followup)
    "$STAGE"; echo "done" >> "$OUT/suite.log"; exit 0 ;;
esac
if [ "$STAGE" != mesh ]; then
  if [ "$NGPU" -ge 2 ]; then
    (CUDA_VISIBLE_DEVICES=1 kernels > "$OUT/kernels.log" 2>&1) &
    (CUDA_VISIBLE_DEVICES=0 strategies > "$OUT/strategies.log" 2>&1)
    wait
  else
    strategies > "$OUT/strategies.log" 2>&1
    kernels > "$OUT/kernels.log" 2>&1
  fi
fi
if [ "$STAGE" != single ] && [ "$NGPU" -ge 2 ]; then
  timeout 200 python scripts/bench_mesh.py "$OUT/mesh.json" --reps 1 \
      > "$OUT/mesh.log" 2>&1
fi
echo "done" >> "$OUT/suite.log"
