#!/usr/bin/env bash
# BENCHMARKS.md "Training": the shipped model's exact recipe (model card of
# checkpoints/synthetic-gsm-llada-16m) on 2 GPUs, in two device calls on the
# SAME warm machine (the paused optimizer state stays on it):
#   bash benchmarks/training.sh OUT_DIR a    # trains part of the schedule, pauses
#   bash benchmarks/training.sh OUT_DIR b    # resumes, finishes, exports
# OUT gets the logs, metrics.jsonl, loss.png and the exported model as
# model.tar.* (cat model.tar.* | tar -x).
source "$(dirname "$0")/common.sh"
RUN=${RUN:-runs/train}
T="python scripts/train_tiny.py --data data/synthetic_gsm --stream \
    --phrasing varied --stream-workers 8 --layers 10 \
    --tokenizer checkpoints/synthetic-gsm-llada-16m --out $RUN --mesh data=2 \
    --seq-len 320 --fit-to-time --max-minutes 14.2 --steps 100000 \
    --eval-every 1000 --ckpt-every 100000"
case "${2:?second argument: a (first call) or b (second call)}" in
  a) rm -rf "$RUN"
     $T --stop-after-minutes 7.6 > "$OUT/train-a.log" 2>&1
     tail -n 5 "$OUT/train-a.log" ;;
  b) if ! ls -d "$RUN"/checkpoints/step_* > /dev/null 2>&1; then
       echo "no paused run in $RUN: run part a on this machine first" >&2
       exit 3
     fi
     $T --eval-problems 0 > "$OUT/train-b.log" 2>&1 || exit 1
     cp "$RUN/metrics.jsonl" "$RUN/loss.png" "$OUT/"
     tar -cf - -C "$RUN" model | split -b 15M - "$OUT/model.tar."
     tail -n 3 "$OUT/train-b.log" ;;
  *) echo "second argument: a or b" >&2; exit 2 ;;
esac
