#!/usr/bin/env bash
# BENCHMARKS.md "lm-eval log-likelihood": ms per request and per Monte-Carlo
# copy of the lm-eval model's likelihood at batch sizes 1-128, 8 requests
# of 480 + 8 tokens, 128 copies each; random bf16 weights at LLaDA-8B
# shapes, then the shipped model (one GPU).
source "$(dirname "$0")/common.sh"
python scripts/bench_loglikelihood.py --arch llada --batch 1 8 32 128 \
    --json "$OUT/llada-8b.json" | tee "$OUT/llada-8b.log"
python scripts/bench_loglikelihood.py \
    --checkpoint checkpoints/synthetic-gsm-llada-16m --batch 1 8 32 128 \
    --json "$OUT/shipped.json" | tee "$OUT/shipped.log"
