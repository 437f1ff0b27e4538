# Stage 's10train_a' of scripts/bench_suite.sh (sourced there: OUT is set,
# the working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s10train_a    # about 8.5 minutes
# and AT ONCE after it, on the same still-warm 2-GPU machine, s10train_b
# (the paused optimizer state stays there; see train2a.sh).
#
# Tenth session (issue 6): the ninth session's recipe (s9train_a/b: varied
# phrasing, the same schedule and time budget) with 10 layers instead of 8,
# 15.54M parameters: the largest model of this width whose bfloat16 export
# stays under issue 6's 25 MB (about 24.4 MB). The ninth session's model
# saw ~270 training tokens per parameter, far more than a compute-optimal
# split, and its wrong answers are nearly all wrong digits: capacity, not
# data, is the likelier limit. Depth rather than MLP width, because carries
# through multi-digit products are a sequential computation.
TRAIN10="python scripts/train_tiny.py --data data/synthetic_gsm --stream \
    --phrasing varied --stream-workers 8 --layers 10 \
    --tokenizer checkpoints/synthetic-gsm-llada-16m --out runs/train10 \
    --mesh data=2 --seq-len 320 --fit-to-time --max-minutes 14.2 \
    --steps 100000 --eval-every 1000 --ckpt-every 100000"
s10train_a() {
  mkdir -p runs
  rm -rf runs/train10
  $TRAIN10 --stop-after-minutes 7.6 > "$OUT/train10a.log" 2>&1
  ls runs/train10/checkpoints >> "$OUT/train10a.log" 2>&1
  tail -n 5 "$OUT/train10a.log"
}
