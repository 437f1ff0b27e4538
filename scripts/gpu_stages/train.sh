# Stage 'train' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR train
# train (issue 6, one call on 2 GPUs, <= 10 minutes): continue the shipped
# model from its weights for the 7.6 of the 15 training minutes it
# has not used, then the quality table of the result. OUT gets the model
# and the tables; bring the model back with tar + split (files <= 16 MiB).
# A record of the third session's run: the model it continued (the second
# session's, then checkpoints/synthetic-gsm-llada-12m) is only in the git
# history now, so this stage no longer runs as written.
train() {
  python scripts/make_synthetic_gsm.py runs/synthetic_gsm --train 200000 \
      --test 1000 --ood 500 --seed 0 --workers 16 > "$OUT/train.log" 2>&1
  cmp runs/synthetic_gsm/test.jsonl data/synthetic_gsm/test.jsonl \
      >> "$OUT/train.log" 2>&1 || { echo "test split differs" >> "$OUT/train.log"; return 1; }
  python scripts/train_tiny.py --data runs/synthetic_gsm --out runs/train_warm \
      --mesh data=2 --init-from checkpoints/synthetic-gsm-llada-12m \
      --fit-to-time --max-minutes 6.0 --steps 100000 --lr 5e-4 \
      --warmup-steps 100 --eval-every 1000 --ckpt-every 100000 \
      --eval-problems 128 >> "$OUT/train.log" 2>&1
  timeout 150 python scripts/eval_quality.py --checkpoint runs/train_warm/model \
      --limit 256 --no-progress --out-dir "$OUT/quality" > "$OUT/quality.log" 2>&1
  cp -r runs/train_warm/model runs/train_warm/loss.png \
      runs/train_warm/metrics.jsonl "$OUT/"
}
