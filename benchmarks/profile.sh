#!/usr/bin/env bash
# BENCHMARKS.md "Strategy steps", kernel time per step: one traced decode
# of Flash-dLLM and Flash-Cache at gen 512, summed by kernel category.
source "$(dirname "$0")/common.sh"
python scripts/profile_step.py --only flash-dllm flash-cache --batch 32 1 \
    --gen 512 --per-step 8 --out-dir "$OUT" | tee "$OUT/profile.log"
