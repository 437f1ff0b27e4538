#!/usr/bin/env bash
# BENCHMARKS.md "LLaDA2 (MoE) steps": strategy llada2 at LLaDA2.0-mini
# shapes (random bf16 weights, prompt 768, gen 512, 16 tokens per step),
# batch 1 and 32, and one MoE layer alone with its routed experts by the
# grouped kernel and by the dense every-expert path; beside them the dense
# LLaDA-8B reference sampler (`llada`) at the same shapes, measured in the
# same run. Each part fits one 10-minute device call:
#   bash benchmarks/moe.sh OUT_DIR tests   # the grouped kernel's GPU tests
#   bash benchmarks/moe.sh OUT_DIR layer   # one MoE layer, a tiling sweep
#   bash benchmarks/moe.sh OUT_DIR steps   # llada2 whole-window steps (+ the layer)
#   bash benchmarks/moe.sh OUT_DIR cached  # llada2 block-cache steps
#   bash benchmarks/moe.sh OUT_DIR dense   # the LLaDA-8B reference
#   bash benchmarks/moe.sh OUT_DIR mosaic  # Mosaic GPU's grouped kernel:
#       its GPU tests, then one MoE layer by it beside Triton and the
#       grouped GEMMs alone (bf16 and int8 stacks; window and block-cache
#       token counts, batch 1 and 32)
#   bash benchmarks/moe.sh OUT_DIR         # all six
source "$(dirname "$0")/common.sh"
PART=${2:-all}
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
if part tests; then
  JAX_PLATFORMS=cuda timeout 300 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_grouped_matmul.py \
      > "$OUT/gpu-tests.log" 2>&1; tail -n 3 "$OUT/gpu-tests.log"
fi
if part layer; then
  # tile_m,block_n,block_k[,num_warps,num_stages]
  timeout 540 python scripts/bench_moe.py --batch 1 32 --layer-only \
      --tilings 64,128,64 64,128,64,8,3 32,128,64 128,128,64,8,3 \
      64,256,64,8,2 64,128,128,8,2 --json "$OUT/moe-layer.json" \
      > "$OUT/moe-layer.log" 2>&1
  grep -h "^|\|device" "$OUT/moe-layer.log"
fi
if part steps; then  # the reference's whole-window step (block_cache=False)
  timeout 580 python scripts/bench_moe.py --batch 1 32 --window \
      --json "$OUT/moe.json" > "$OUT/moe.log" 2>&1
  grep -h "^|\|device" "$OUT/moe.log"
fi
if part cached; then  # strategy llada2's default, the block cache
  timeout 580 python scripts/bench_moe.py --batch 1 32 --layer-paths grouped \
      --json "$OUT/moe-cached.json" > "$OUT/moe-cached.log" 2>&1
  grep -h "^|\|device" "$OUT/moe-cached.log"
fi
if part dense; then
  timeout 580 python scripts/bench_strategies.py --only llada --batch 1 32 \
      --gen 512 --prompt 768 --per-step 16 --reps 1 --json "$OUT/dense.json" \
      > "$OUT/dense.log" 2>&1
  grep -h "^|\|^{\|device" "$OUT/dense.log"
fi
if part mosaic; then
  JAX_PLATFORMS=cuda timeout 240 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_kernel_grouped_matmul_mosaic.py \
      > "$OUT/mosaic-tests.log" 2>&1; tail -n 3 "$OUT/mosaic-tests.log"
  timeout 330 python scripts/bench_moe.py --batch 1 32 --layer-only \
      --layer-paths grouped mosaic --layer-tokens window block \
      --gemm bf16 int8 --json "$OUT/moe-mosaic.json" \
      > "$OUT/moe-mosaic.log" 2>&1
  grep -h "^|\|device\|Triton" "$OUT/moe-mosaic.log"
fi
