#!/usr/bin/env bash
# BENCHMARKS.md "Multi-GPU".
#   bash benchmarks/multi_gpu.sh OUT            Flash-Cache at LLaDA-8B shapes
#       (random bf16 weights) on 1 and 2 GPUs, data and tensor parallel.
#   bash benchmarks/multi_gpu.sh OUT PART       LLaDA2.0-flash (100B MoE,
#       random weights built on their shards), PART one of:
#     llada2-flash-bf16   bf16, each mesh that fits (model=4 on 4 GPUs; also
#                         data=2,model=4 on 8): llada2 and llada2-flash at
#                         batch 1, 32, 128, per-GPU floor, peaks, profile
#     llada2-flash-fp8    the same in fp8
#     llada2-flash-serve  serve --mesh model=4 at saturation against offline
#     llada2-flash-exact  token ids on meshes against one device: the shipped
#                         LLaDA2 model, and a 4-layer flash slice
#     llada2-flash-slice  ONE GPU: the dense layer + 3 MoE layers at flash
#                         shapes, bf16 and fp8, ms per MoE layer vs its floor
#     llada2-flash        all of the above but the slice, in turn
source "$(dirname "$0")/common.sh"
PART=${2:-default}
# the flash's bf16 weights take about 52 of an H100's 80 GB per GPU
[ "$PART" = default ] || export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
FLASH="python scripts/bench_flash_mesh.py"
meshes() {  # the flash's meshes this host has the GPUs for (model=8: the
  # flash's 4 KV heads do not split 8 ways; bench_flash_mesh.py says so)
  if [ "$NGPU" -ge 4 ]; then echo model=4; fi
  if [ "$NGPU" -ge 8 ]; then echo data=2,model=4 model=8; fi
}
flash_format() {  # one process per mesh: each one's peak memory its own
  for m in $(meshes); do
    $FLASH --meshes "$m" --formats "$1" --profile \
        --json "$OUT/flash-$1-${m//[=,]/_}.json" \
        2>&1 | tee "$OUT/flash-$1-${m//[=,]/_}.log"
  done
}
exact() {
  local Q="python scripts/eval_quality.py --checkpoint
      checkpoints/synthetic-gsm-llada2-moe --strategies llada2 --limit 64
      --gen-lengths 128 --no-progress"
  $Q --out-dir "$OUT/q-none" > "$OUT/q-none.log" 2>&1
  # the shipped model has 6 heads over 2 KV heads: model=2 at most
  for m in model=2 data=2 data=2,model=2 data=4,model=2; do
    n=1; for kv in ${m//,/ }; do n=$(( n * ${kv#*=} )); done
    [ "$n" -le "$NGPU" ] || continue
    $Q --mesh "$m" --out-dir "$OUT/q-$m" > "$OUT/q-$m.log" 2>&1
    python scripts/compare_runs.py "$OUT/q-none" "$OUT/q-$m" \
        --fields token_ids steps forwards 2>&1 \
        | tee "$OUT/tokens-${m//[=,]/_}.log"
  done
  $FLASH --meshes none $(meshes) --layers 4 --formats bf16 --batch 8 \
      --json "$OUT/flash-slice-exact.json" 2>&1 \
      | tee "$OUT/flash-slice-exact.log"
}
case "$PART" in
  default)
    python scripts/bench_mesh.py "$OUT/mesh.json" --reps 1 \
        | tee "$OUT/mesh.log" ;;
  llada2-flash-bf16) flash_format bf16 ;;
  llada2-flash-fp8) flash_format fp8 ;;
  llada2-flash-serve)
    python scripts/bench_serve.py --model llada2-flash --mesh model=4 \
        --strategy llada2 --slots 32 --gen-length 256 --prompt-len 512 \
        --max-prompt-tokens 512 --requests 64 --rates inf \
        --out "$OUT/serve-flash-model4.json" 2>&1 \
        | tee "$OUT/serve-flash-model4.log" ;;
  llada2-flash-exact) exact ;;
  llada2-flash-slice)
    $FLASH --meshes none --layers 4 --layer-diff --strategies llada2 \
        --formats bf16 fp8 --json "$OUT/flash-slice.json" 2>&1 \
        | tee "$OUT/flash-slice.log" ;;
  llada2-flash)
    for p in bf16 fp8 serve exact; do
      bash benchmarks/multi_gpu.sh "$OUT" "llada2-flash-$p"
    done ;;
  *) echo "unknown part $PART" >&2; exit 2 ;;
esac
