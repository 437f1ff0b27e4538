#!/usr/bin/env bash
# The shipped LLaDA2-format model (checkpoints/synthetic-gsm-llada2-moe):
# its training recipe on one GPU and BENCHMARKS.md's "LLaDA2 quality" and
# "LLaDA2 speed" tables, each part one device call of under 10 minutes:
#   bash benchmarks/llada2_model.sh OUT_DIR train    # trains, exports, solves
#                                                    # the README's problem
#   INIT=DIR DATA_SEED=K bash benchmarks/llada2_model.sh OUT_DIR continue
#                                    # a further stage from DIR's weights
#   bash benchmarks/llada2_model.sh OUT_DIR quality "192 256"
#   bash benchmarks/llada2_model.sh OUT_DIR speed    # LLaDA2.0-mini shapes
#   bash benchmarks/llada2_model.sh OUT_DIR editing "256"  # llada2.1 quality
#   bash benchmarks/llada2_model.sh OUT_DIR editing-speed  # llada2.1 vs llada2
# quality runs on $RUN/model when it exists, else on the shipped checkpoint.
# OUT gets logs, metrics.jsonl, loss.png, model.tar.* (cat model.tar.* |
# tar -x) and quality.tar.xz. A longer schedule runs as stages of one device
# call each (a machine can be lost between calls): train, then continue
# from the exported weights (INIT, default the shipped checkpoint) with a
# fresh optimizer, warmup and cosine schedule on the stream of DATA_SEED,
# so no stage sees the problems of another.
source "$(dirname "$0")/common.sh"
RUN=${RUN:-runs/train-llada2}
SHIPPED=checkpoints/synthetic-gsm-llada2-moe
PROMPT="Ruby bakes 6 trays of rolls with 7 on each tray. She eats 7 of them and gives 3 to Henry. She packs the rest into boxes of 4. How many boxes does she fill?"
COMMON="--data data/synthetic_gsm --stream --phrasing varied \
    --stream-workers 8 --block-length 32 --batch-size 128 --seq-len 320 \
    --out $RUN --fit-to-time --max-minutes ${MINUTES:-5.0} --steps 100000 \
    --eval-every 1000 --ckpt-every 100000 --eval-problems 0"
MODEL="--arch llada2 --layers 10 --d-model 384 --heads 6 --kv-heads 2 \
    --mlp-hidden 768 --experts 8 --top-k 2 --expert-hidden 128 \
    --shared-experts 1 --dense-layers 1"
# The four decodings of the quality table: the reference sampler (one token
# a step), its threshold rule without and with the block cache, llada2-flash.
REF="llada2:threshold=none,block_cache=false"
THR="llada2:block_cache=false"
case "${2:?second argument: train, continue, quality, speed, editing or editing-speed}" in
  train|continue)
     if [ "$2" = train ]; then
       python scripts/train_tiny.py $MODEL $COMMON > "$OUT/train.log" 2>&1 || exit 1
     else
       python scripts/train_tiny.py --init-from "${INIT:-$SHIPPED}" \
           --data-seed "${DATA_SEED:?DATA_SEED: seed of the problem stream of this stage}" \
           --lr ${LR:-1e-3} $COMMON > "$OUT/train.log" 2>&1 || exit 1
     fi
     tail -n 3 "$OUT/train.log"
     cp "$RUN/metrics.jsonl" "$RUN/loss.png" "$OUT/"
     tar -cf - -C "$RUN" model | split -b 15M - "$OUT/model.tar."
     python -m flash_dllm_jax generate --checkpoint "$RUN/model" \
         --strategy llada2-flash --prompt "$PROMPT" --gen-length 192 \
         | tee "$OUT/readme-problem.txt" ;;
  quality)
     ckpt=$SHIPPED; [ -d "$RUN/model" ] && ckpt=$RUN/model
     export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.2}
     for len in ${3:-192 256}; do
       for part in uncached cached; do
         group="$REF $THR"; [ $part = cached ] && group="llada2 llada2-flash"
         name=quality-${LIMIT:-1000}-gen$len-$part
         timeout ${QUALITY_TIMEOUT:-540} python scripts/eval_quality.py --checkpoint "$ckpt" \
             --limit ${LIMIT:-1000} --gen-lengths $len --strategies $group \
             --reference "$REF" --baseline "$THR" --no-progress \
             --out-dir "$OUT/q" > "$OUT/$name.log" 2>&1 &
       done
     done
     wait
     timeout ${QUALITY_TIMEOUT:-540} python scripts/eval_quality.py \
         --checkpoint "$ckpt" --limit ${LIMIT:-1000} --gen-lengths ${3:-192 256} \
         --strategies "$REF" "$THR" llada2 llada2-flash --reference "$REF" \
         --baseline "$THR" --no-progress --out-dir "$OUT/q" \
         > "$OUT/quality.log" 2>&1
     tar -cJf "$OUT/quality.tar.xz" -C "$OUT" q
     grep -h "^|" "$OUT/q/quality.md" ;;
  speed)
     timeout ${SPEED_TIMEOUT:-580} python scripts/bench_moe.py --batch 1 32 \
         --strategies llada2 llada2-flash --layer-paths grouped --reps 1 \
         --json "$OUT/llada2-speed.json" > "$OUT/llada2-speed.log" 2>&1
     grep -h "^|\|device" "$OUT/llada2-speed.log" ;;
  editing)
     # llada2 beside llada2.1 (the reference's defaults, editing off at the
     # speed mode's threshold, the card's quality and speed modes), every
     # llada2.1 run stopping after the block with an EOS; llada2-flash as
     # the comparison row.
     ckpt=$SHIPPED; [ -d "$RUN/model" ] && ckpt=$RUN/model
     export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.2}
     E=eos_early_stop=true
     NOEDIT="llada2.1:threshold=0.5,editing_threshold=none,$E"
     FLASH="llada2-flash"
     all="llada2 llada2.1:$E $NOEDIT llada2.1-quality:$E llada2.1-speed:$E $FLASH"
     i=0
     for group in "llada2 llada2.1:$E $NOEDIT" "llada2.1-quality:$E llada2.1-speed:$E" "$FLASH"; do
       i=$((i + 1))
       timeout ${QUALITY_TIMEOUT:-480} python scripts/eval_quality.py --checkpoint "$ckpt" \
           --limit ${LIMIT:-1000} --gen-lengths ${3:-256} --strategies $group \
           --reference llada2 --baseline llada2 --no-progress \
           --out-dir "$OUT/e" > "$OUT/editing-$i.log" 2>&1 &
     done
     wait
     timeout ${QUALITY_TIMEOUT:-480} python scripts/eval_quality.py \
         --checkpoint "$ckpt" --limit ${LIMIT:-1000} --gen-lengths ${3:-256} \
         --strategies $all --reference llada2 --baseline llada2 \
         --no-progress --out-dir "$OUT/e" > "$OUT/editing.log" 2>&1
     tar -cJf "$OUT/editing.tar.xz" -C "$OUT" e
     grep -h "^|" "$OUT/e/quality.md"
     grep -h "^|" "$OUT/e/results.md" ;;  # fwd/tok: model calls per token
  editing-speed)
     timeout ${SPEED_TIMEOUT:-540} python scripts/bench_moe.py --batch 1 32 \
         --strategies llada2 llada2.1 --layer-paths grouped --reps 1 \
         --json "$OUT/llada21-speed.json" > "$OUT/llada21-speed.log" 2>&1
     grep -h "^|\|device\|^llada2.1 /" "$OUT/llada21-speed.log" ;;
  *) echo "second argument: train, continue, quality, speed, editing or editing-speed" >&2; exit 2 ;;
esac
