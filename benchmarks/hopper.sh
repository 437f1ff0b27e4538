#!/usr/bin/env bash
# BENCHMARKS.md "Hopper kernels": the Mosaic GPU kernels and the automatic
# attention split against the Triton kernels and the fixed tilings, one
# part per ten-minute device call:
#   bash benchmarks/hopper.sh OUT_DIR kernels   # 8-bit GEMM table at decode
#                                               # rows
#   bash benchmarks/hopper.sh OUT_DIR steps1    # batch 1 Flash-dLLM steps,
#                                               # bf16 and all weights 8-bit
#   bash benchmarks/hopper.sh OUT_DIR steps32   # batch 32 Flash-dLLM steps,
#                                               # bf16
#   bash benchmarks/hopper.sh OUT_DIR steps32-fp8  # the same, 8-bit weights
#   bash benchmarks/hopper.sh OUT_DIR steps32-mosaic  # bf16, auto split
#                                               # with and without Mosaic GPU
#                                               # attention and cache write
#   bash benchmarks/hopper.sh OUT_DIR onepass   # one weight read a step:
#                                               # quality, steps
#   bash benchmarks/hopper.sh OUT_DIR profile   # kernel time per batch-1
#                                               # step, both strategies
#   bash benchmarks/hopper.sh OUT_DIR gpu-tests # every gpu-marked test
#   bash benchmarks/hopper.sh OUT_DIR memory    # batch 32, JAX's default
#                                               # memory settings: steady
#                                               # steps and peaks of
#                                               # flash-cache / flash-dllm
#   bash benchmarks/hopper.sh OUT_DIR memory-all  # batch 32 peaks of the
#                                               # other strategies
#   bash benchmarks/hopper.sh OUT_DIR memory-large  # batch 64 and 128,
#                                               # bf16 and fp8 weights
#   bash benchmarks/hopper.sh OUT_DIR kv8       # float8 KV cache: batch
#                                               # 64/128 of flash-dllm and
#                                               # flash-cache against the
#                                               # bf16-cache batch 32 row
#   bash benchmarks/hopper.sh OUT_DIR kv8-fp8   # the same, fp8 weights
#   bash benchmarks/hopper.sh OUT_DIR long-context [STRATEGIES]  # step and
#                                               # peak against the prompt
#                                               # (LLaDA-8B; flash-dllm)
#   bash benchmarks/hopper.sh OUT_DIR long-context-llada2 [PROMPTS]  # the
#                                               # same at LLaDA2.0-mini
#                                               # shapes, batch 1 and 8,
#                                               # steady step and prefill
# The memory and long-context parts run one process per row group: a
# row's peak is `peak_bytes_in_use`, which never goes down in a process.
# SMOKE=1 runs them on the tiny model (any backend: a check of the part).
source "$(dirname "$0")/common.sh"
PART=${2:?part: one of those listed above}
S="python scripts/bench_strategies.py --prompt 768 --per-step 4 --reps 1 \
--gen 512 --only flash-dllm --steady"
ALL8="--quantize fp8 --quantize-head --quantize-embedding"
T="python -m pytest -q -rs -m gpu -p no:cacheprovider"  # -rs: why each skip
ROWS='^(\||FAILED)'  # the table, and any variant that gave no row
# The steps32* tables were measured with 95% of the card (the decode then
# held three KV cache copies); kept so that they reproduce as recorded
B32_MEM="env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95"
case $PART in
kernels)
  # the 8-bit GEMMs at the rows a sequence's passes have (16 and 144), every
  # format and backend, fp8's default W8A8 path (fp8_w8a8 xla) included; the
  # Mosaic GPU tests run in gpu-tests
  timeout 560 python scripts/bench_kernels.py "$OUT/qmatmul.json" --qmatmul \
      --ms 16,144 --match " (int8|fp8|fp8_w8a8) " --markdown "$OUT/qmatmul.md" \
      > "$OUT/qmatmul.log" 2>&1
  cat "$OUT/qmatmul.md"
  ;;
steps1)
  timeout 200 $S --batch 1 --variants split=32 split=auto \
      split=auto,attention=mosaic,cache=mosaic \
      --json "$OUT/b1-bf16.json" | grep -E "$ROWS"
  # fp8 runs XLA's W8A8 GEMM at every Q unless stream-max-q says otherwise:
  # 160 sends both passes (144 and 16 rows) through the streaming kernel
  timeout 300 $S --batch 1 $ALL8 --variants split=auto \
      split=auto,stream-max-q=160 split=auto,qmatmul=mosaic,stream-max-q=160 \
      --json "$OUT/b1-fp8-all8.json" | grep -E "$ROWS"
  ;;
onepass)
  # the shipped model, all 1000 held-out problems, gen 192 and 256 side by
  # side (records kept as one archive), then the batch-1 step at LLaDA-8B
  # shapes
  Q=$(mktemp -d)
  for len in 192 256; do
    (XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 240 python \
         scripts/eval_quality.py --limit 1000 --gen-lengths $len \
         --strategies flash-dllm flash-dllm-onepass \
         flash-dllm-onepass:skip_drafts=False --reference flash-dllm \
         --baseline flash-dllm --no-progress --out-dir "$Q/quality-$len" \
         > "$OUT/quality-$len.log" 2>&1) &
  done
  wait
  tar -cJf "$OUT/quality-records.tar.xz" -C "$Q" quality-192 quality-256
  cat "$Q"/quality-*/*.md > "$OUT/quality.md"
  grep -h "^|" "$OUT/quality.md" | sort -u
  timeout 200 $S --batch 1 --only flash-dllm flash-dllm-onepass \
      --variants split=auto --json "$OUT/onepass-b1.json" | grep -E "$ROWS"
  ;;
steps32)
  # a variant compiles two batch-32 decodes (--steady), so each weight
  # format is its own part
  $B32_MEM timeout 570 $S --batch 32 --variants split=32 split=auto \
      --json "$OUT/b32-bf16.json" | grep -E "$ROWS"
  ;;
steps32-mosaic)
  # the cache write alone too: at batch 32 the Mosaic GPU attention still
  # writes a partial per key split where the Triton kernel merges in place
  $B32_MEM timeout 570 $S --batch 32 --variants split=auto \
      split=auto,cache=mosaic split=auto,attention=mosaic,cache=mosaic \
      --json "$OUT/b32-bf16-mosaic.json" | grep -E "$ROWS"
  ;;
steps32-fp8)
  $B32_MEM timeout 570 $S --batch 32 --quantize fp8 \
      --variants split=32 split=auto \
      --json "$OUT/b32-fp8.json" | grep -E "$ROWS"
  ;;
profile)
  # 16 tokens a step (the query budget): 32 loop steps of the same shapes,
  # a quarter of the trace that 4 a step would write
  timeout 570 python scripts/profile_step.py --only \
      flash-dllm flash-dllm-onepass --batch 1 --gen 512 --per-step 16 \
      --attention-split-target auto --out-dir "$OUT" | tee "$OUT/profile.log"
  ;;
gpu-tests)
  # -n 4: four pytest workers share the GPU (compiling is the bulk of it).
  # Modules that need the OpenAI client hold no gpu-marked test; where the
  # client is not installed they are left out rather than failing to import
  skip=()
  if ! python -c "import openai" 2> /dev/null; then
    for f in $(grep -lE "^(import openai|from tests.serve_case import)" \
        tests/test_*.py); do
      skip+=(--ignore "$f")
    done
    echo "no openai client: left out ${skip[*]}"
  fi
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${TEST_SECONDS:-570} $T -n 4 \
      --durations=40 "${skip[@]}" tests > "$OUT/gpu-tests-all.log" 2>&1
  tail -n 50 "$OUT/gpu-tests-all.log"
  ;;
memory)
  # no XLA_PYTHON_CLIENT_MEM_FRACTION: JAX's default 75% of the card
  M="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 768 \
--gen 512 --reps 1 --batch 32"
  for s in flash-cache flash-dllm; do
    timeout 280 $M --only $s --per-step 4 --steady \
        --json "$OUT/mem-b32-$s.json" | grep -E "$ROWS"
  done
  ;;
memory-all)
  # peaks (and whole-decode steps) of the other strategies at batch 32; a
  # coarse fixed schedule, as the peak does not depend on the step count
  M="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 768 \
--gen 512 --reps 1 --batch 32"
  for s in llada fast-dllm-prefix fast-dllm-dual; do
    timeout 150 $M --only $s --per-step 32 --json "$OUT/mem-b32-$s.json" \
        | grep -E "$ROWS"
  done
  for s in flash-dllm-onepass elastic-cache; do
    timeout 150 $M --only $s --per-step 16 --json "$OUT/mem-b32-$s.json" \
        | grep -E "$ROWS"
  done
  ;;
memory-large)
  # batch 64 then 128 in one process (the peak grows with the batch; a row
  # whose KV cache cannot fit says so without compiling)
  M="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 768 \
--gen 512 --reps 1 --per-step 16 --batch 64 128"
  timeout 200 $M --only flash-cache --json "$OUT/mem-large-flash-cache.json" \
      | grep -E "$ROWS"
  timeout 200 $M --only flash-dllm --json "$OUT/mem-large-flash-dllm.json" \
      | grep -E "$ROWS"
  timeout 200 $M --only flash-dllm --quantize fp8 \
      --json "$OUT/mem-large-flash-dllm-fp8.json" | grep -E "$ROWS"
  ;;
kv8|kv8-fp8)
  # a process per row group (peaks never go down in a process): the
  # baseline (bf16 cache, batch 32), then the float8 cache at batch 128 of
  # flash-dllm and flash-cache, then both at batch 64 (each step with its
  # share of the prefill: a compile each, to stay in one device call);
  # JAX's default memory settings (75% of the card, 63.8 GB on an H100,
  # which batch 128 fits: the bf16 weights and the 8-bit cache are 59.6 GB
  # of its 62.9 GB peak); then the table of ratios to the baseline
  W=""
  [ "$PART" = kv8-fp8 ] && W="--quantize fp8"
  M="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 768 \
--gen 512 --reps 1 --per-step 16 $W"
  F8="--kv-cache-dtype float8_e4m3fn"
  timeout 130 $M --only flash-dllm --batch 32 \
      --json "$OUT/$PART-base.json" | grep -E "$ROWS"
  for s in flash-dllm flash-cache; do
    timeout 140 $M --only $s --batch 128 $F8 \
        --json "$OUT/$PART-$s-b128.json" | grep -E "$ROWS"
  done
  timeout 120 $M --only flash-dllm flash-cache --batch 64 $F8 \
      --json "$OUT/$PART-b64.json" | grep -E "$ROWS"
  python scripts/kv_cache_table.py "$OUT/$PART-base.json" \
      "$OUT/$PART-flash-dllm-b128.json" "$OUT/$PART-flash-cache-b128.json" \
      "$OUT/$PART-b64.json" --json "$OUT/$PART-table.json"
  ;;
long-context)
  # prompt 1k, 2k and the longest the 4096-token context leaves gen 512;
  # ascending prompts share a process (the peak grows with them); the
  # strategies named after the part (default flash-dllm)
  L="python scripts/bench_strategies.py ${SMOKE:+--smoke} --prompt 1024 2048 \
3584 --gen 512 --reps 1 --per-step 8 --steady"
  for s in ${3:-flash-dllm}; do
    for b in 1 8; do
      timeout 280 $L --only $s --batch $b --json "$OUT/long-b$b-$s.json" \
          | grep -E "$ROWS|read rate"
    done
  done
  ;;
long-context-llada2)
  # a process per prompt length (default 4096 8192 16384 32768; one call
  # of 10 minutes takes two or three of them); BA="fused split": both
  # block-attention paths in each process (default: the default path);
  # PROMPT_TIMEOUT: seconds a prompt length may take (32k needs about 300)
  for p in ${3:-4096 8192 16384 32768}; do
    timeout ${PROMPT_TIMEOUT:-240} python scripts/bench_moe.py ${SMOKE:+--smoke} --layer-paths \
        --strategies llada2 --batch 1 8 --steady --prompt $p --gen 512 \
        --reps 1 ${BA:+--block-attention $BA} \
        --json "$OUT/long-llada2-p$p.json" | grep -E "step|/ fused"
  done
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
