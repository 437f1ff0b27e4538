#!/usr/bin/env bash
# docs/memory.md "Block-causal attention on the kernel": the split path
# (Kernels(block_attention="split"), the GPU default) beside the fused one, both
# measured in one run, at LLaDA2.0-mini's shapes. Each part is bounded so
# that all three fit 9 minutes:
#   bash benchmarks/block_attention.sh OUT_DIR tests  # its GPU exactness tests
#   bash benchmarks/block_attention.sh OUT_DIR layer  # one layer's attention,
#       block step and window, prompts 4k and 32k, batch 1 and 8
#   bash benchmarks/block_attention.sh OUT_DIR steps  # llada2 block-cache
#       steps at prompt 4k, batch 1 and 8, fused then split
#   bash benchmarks/block_attention.sh OUT_DIR        # all three
#   bash benchmarks/block_attention.sh OUT_DIR smoke  # tiny shapes, any backend
source "$(dirname "$0")/common.sh"
PART=${2:-all}
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
if part tests; then
  JAX_PLATFORMS=cuda timeout 150 python -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_blockwise_attention.py \
      tests/test_long_prompt.py > "$OUT/gpu-tests.log" 2>&1
  tail -n 3 "$OUT/gpu-tests.log"
fi
if part layer; then
  timeout 150 python scripts/bench_block_attention.py --prompt 4096 32768 \
      --batch 1 8 --out "$OUT" > "$OUT/block-attention.log" 2>&1
  grep -h "^|\|device" "$OUT/block-attention.log"
fi
if part steps; then
  timeout 240 python scripts/bench_moe.py --layer-paths --batch 1 8 \
      --prompt 4096 --gen 512 --reps 1 --block-attention fused split \
      --json "$OUT/moe-block-attention.json" > "$OUT/moe.log" 2>&1
  grep -h "^|\|device\|/ fused" "$OUT/moe.log"
fi
if [ "$PART" = smoke ]; then
  python scripts/bench_block_attention.py --smoke --out "$OUT" \
      > "$OUT/block-attention.log" 2>&1
  grep -h "^|\|device" "$OUT/block-attention.log"
  python scripts/bench_moe.py --smoke --layer-paths --block-attention fused \
      split --json "$OUT/moe-block-attention.json" > "$OUT/moe.log" 2>&1
  grep -h "^|\|device\|/ fused" "$OUT/moe.log"
fi
