#!/usr/bin/env bash
# BENCHMARKS.md "Multi-GPU": Flash-Cache at LLaDA-8B shapes (random bf16
# weights) on 1 and 2 GPUs, data and tensor parallel.
source "$(dirname "$0")/common.sh"
python scripts/bench_mesh.py "$OUT/mesh.json" --reps 1 | tee "$OUT/mesh.log"
