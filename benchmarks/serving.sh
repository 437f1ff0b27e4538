#!/usr/bin/env bash
# BENCHMARKS.md "Serving": the OpenAI server under Poisson load against
# offline static batches of the same slots (tokens/s ratio, TTFT and latency
# p50/p99 against a request alone, a burst that fits the slots, the load
# plot; the shipped part adds JSON-schema decoding's cost). Each part fits
# one device call of under 9 minutes (the cold start: bench_serve.py
# --cold-start, on its own). One part per device call:
#   bash benchmarks/serving.sh OUT_DIR 8b        # LLaDA-8B shapes, random bf16
#                                  (RATES=inf: saturation and the burst only)
#   bash benchmarks/serving.sh OUT_DIR shipped   # the shipped model
# The GPU image lacks the server's packages: carry them as wheels (.whl, see
# the device notes): fastapi, starlette, pydantic, pydantic-core,
# annotated-types, typing-inspection, uvicorn (about 3 MB), and llguidance
# for the shipped part's JSON-schema row (skipped without it); the load
# generator uses aiohttp (the GPU image has it).
source "$(dirname "$0")/common.sh"
case "${2:?part: 8b or shipped}" in
  8b)
     timeout ${TIMEOUT:-530} python scripts/bench_serve.py --model llada-8b \
         --slots 32 --gen-length 256 --prompt-len 64 --max-prompt-tokens 64 \
         --requests 64 --rates ${RATES:-1,inf} \
         --out "$OUT/serve_8b.json" 2>&1 | tee "$OUT/serve_8b.log" ;;
  shipped)
     timeout ${TIMEOUT:-530} python scripts/bench_serve.py --model shipped \
         --slots 32 --gen-length 192 --requests 256 --max-prompt-tokens 128 \
         --rates 8,32,inf --json-schema 16 --out "$OUT/serve_shipped.json" 2>&1 \
         | tee "$OUT/serve_shipped.log" ;;
  *) echo "unknown part $2 (8b or shipped)" >&2; exit 2 ;;
esac
