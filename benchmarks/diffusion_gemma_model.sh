#!/usr/bin/env bash
# The project's DiffusionGemma-format model (checkpoints/synthetic-gsm-
# diffusion-gemma): its training recipe on one GPU and its quality table
# (accuracy and tokens per denoising step on the 1000 held-out problems),
# each part one device call of under 9 minutes:
#   bash benchmarks/diffusion_gemma_model.sh OUT_DIR train     # trains (MINUTES
#                     # of steps, compile included), exports, solves the
#                     # README's problem
#   INIT=DIR DATA_SEED=K bash benchmarks/diffusion_gemma_model.sh OUT_DIR continue
#                     # a further stage from DIR's weights (fresh optimizer)
#   bash benchmarks/diffusion_gemma_model.sh OUT_DIR quality   # diffusion-gemma
#                     # (and diffusion-gemma-flash where registered)
# quality runs on $RUN/model when it exists, else on the shipped checkpoint.
# SMOKE=1: a tiny model, 4 steps and 4 problems (runs on a CPU).
# OUT gets train.log, metrics.jsonl, loss.png, model.tar.* (cat model.tar.*
# | tar -x), readme-problem.txt, quality.log (quality-flash.log) and
# quality.tar.xz.
source "$(dirname "$0")/common.sh"
RUN=${RUN:-runs/train-diffusion-gemma}
SHIPPED=checkpoints/synthetic-gsm-diffusion-gemma
CANVAS=${CANVAS:-64}   # the trained canvas: the objective's and the decode's
GEN=${GEN:-192}        # answer tokens decoded (3 canvases)
PROMPT="Ruby bakes 6 trays of rolls with 7 on each tray. She eats 7 of them and gives 3 to Henry. She packs the rest into boxes of 4. How many boxes does she fill?"
MODEL="--arch diffusion_gemma --layers 10 --global-every 5 --sliding-window 128 \
    --d-model 384 --heads 6 --kv-heads 2 --mlp-hidden 768 --experts 8 --top-k 2 \
    --expert-hidden 128"
COMMON="--data data/synthetic_gsm --stream --phrasing varied --stream-workers 8 \
    --block-length $CANVAS --batch-size 128 --seq-len 352 --out $RUN \
    --fit-to-time --max-minutes ${MINUTES:-6.0} --steps 100000 --eval-every 1000 \
    --ckpt-every 100000 --eval-problems 0"
LIMIT=${LIMIT:-1000}
if [ "${SMOKE:-0}" = 1 ]; then
  MODEL="--arch diffusion_gemma --layers 2 --global-every 2 --sliding-window 16 \
      --d-model 64 --heads 4 --kv-heads 2 --mlp-hidden 128 --experts 4 --top-k 2 \
      --expert-hidden 32"
  COMMON="--data data/synthetic_gsm --stream --stream-workers 1 \
      --block-length $CANVAS --batch-size 4 --seq-len 352 --out $RUN --steps 4 \
      --warmup-steps 1 --log-every 2 --eval-every 4 --ckpt-every 100000 \
      --eval-problems 0"
  LIMIT=${LIMIT_SMOKE:-4}
fi
DG="diffusion-gemma:canvas_length=$CANVAS"
case "${2:?second argument: train, continue or quality}" in
  train|continue)
     if [ "$2" = train ]; then
       python scripts/train_tiny.py $MODEL $COMMON > "$OUT/train.log" 2>&1 || { tail -n 20 "$OUT/train.log"; exit 1; }
     else
       python scripts/train_tiny.py --init-from "${INIT:-$SHIPPED}" \
           --data-seed "${DATA_SEED:?DATA_SEED: seed of the problem stream of this stage}" \
           --lr ${LR:-5e-4} $COMMON > "$OUT/train.log" 2>&1 || { tail -n 20 "$OUT/train.log"; exit 1; }
     fi
     grep -h "schedule fitted\|trained to\|wrote" "$OUT/train.log"
     tail -n 3 "$OUT/train.log"
     cp "$RUN/metrics.jsonl" "$RUN/loss.png" "$OUT/"
     tar -cf - -C "$RUN" model | split -b 15M - "$OUT/model.tar."
     python -m flash_dllm_jax generate --checkpoint "$RUN/model" \
         --strategy diffusion-gemma --canvas-length $CANVAS --max-out-length $GEN \
         --prompt "$PROMPT" | tee "$OUT/readme-problem.txt" ;;
  quality)
     # diffusion-gemma first (its table survives whatever follows), then
     # with diffusion-gemma-flash where registered: eval_quality resumes
     # the finished run and adds the other to the same table.
     ckpt=$SHIPPED; [ -d "$RUN/model" ] && ckpt=$RUN/model
     q() { timeout ${QUALITY_TIMEOUT:-300} python scripts/eval_quality.py \
         --checkpoint "$ckpt" --limit $LIMIT --gen-lengths $GEN --strategies "$@" \
         --reference $DG --baseline $DG --no-progress --out-dir "$OUT/q"; }
     q $DG > "$OUT/quality.log" 2>&1 || { tail -n 20 "$OUT/quality.log"; exit 1; }
     if python -c "from flash_dllm_jax.strategies import STRATEGIES as S; \
                   raise SystemExit('diffusion-gemma-flash' not in S)"; then
       q $DG "diffusion-gemma-flash:canvas_length=$CANVAS" > "$OUT/quality-flash.log" 2>&1 \
           || { echo "diffusion-gemma-flash failed:"; tail -n 5 "$OUT/quality-flash.log"; }
     fi
     tar -cJf "$OUT/quality.tar.xz" -C "$OUT" q
     grep -h "^|" "$OUT/q/quality.md" ;;
  *) echo "second argument: train, continue or quality" >&2; exit 2 ;;
esac
