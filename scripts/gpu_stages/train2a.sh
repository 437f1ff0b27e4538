# Stage 'train2a' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR train2a     # about 8 minutes
# and then AT ONCE, with nothing in between, stage train2b (train2b.sh):
# the paused run's state (float32 params + AdamW moments, about 151 MB)
# stays on this machine, which is kept only 30 s after a call, and is too
# large to come back through OUT and be carried (64 MiB each way).
#
# train2a + train2b (issue 6, 2 GPUs): ONE warmup + cosine schedule over
# fresh problems (--stream: batch s is problems s*256.. of the train stream,
# drawn by 8 worker processes while training, never one twice, never a
# question of data/synthetic_gsm/test.jsonl or ood.jsonl), fitted to 14.2
# minutes x 0.95 = 13.5 minutes of wall time from the start of train2a's
# loop (its compile included); train2a pauses after 7.6 of them and saves,
# train2b resumes the same schedule, data position and optimizer state.
# Training wall time in all: 13.5 minutes plus train2b's compile.
# The tokenizer is the shipped model's (the BPE of the seed-0 corpus).
# When it ran the tokenizer's directory was checkpoints/synthetic-gsm-llada-12m;
# its tokenizer.json is byte for byte the one now in synthetic-gsm-llada-16m.
TRAIN2="python scripts/train_tiny.py --data data/synthetic_gsm --stream \
    --stream-workers 8 --tokenizer checkpoints/synthetic-gsm-llada-16m \
    --out runs/train2 --mesh data=2 --seq-len 320 --fit-to-time \
    --max-minutes 14.2 --steps 100000 --eval-every 1000 --ckpt-every 100000"
train2a() {
  rm -rf runs/train2
  $TRAIN2 --stop-after-minutes 7.6 > "$OUT/train2a.log" 2>&1
  ls runs/train2/checkpoints >> "$OUT/train2a.log" 2>&1
}
