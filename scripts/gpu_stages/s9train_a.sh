# Stage 's9train_a' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR s9train_a     # about 8.5 minutes
# and AT ONCE after it, on the same still-warm 2-GPU machine, s9train_b
# (the paused optimizer state, ~151 MB, stays there; see train2a.sh).
#
# Ninth session (issue 6): the same model, schedule and time budget as the
# sixth session's train2a/train2b, but the stream's solutions are worded
# with phrasing "varied" (flash_dllm_data/phrasing.py): each step has an
# 85/10/5 opener choice and, for a pure sum or product, an 85/15 operand
# order. The tokenizer is the shipped model's.
# When it ran the tokenizer's directory was checkpoints/synthetic-gsm-llada-12m;
# its tokenizer.json is byte for byte the one now in synthetic-gsm-llada-16m.
TRAIN9="python scripts/train_tiny.py --data data/synthetic_gsm --stream \
    --phrasing varied --stream-workers 8 \
    --tokenizer checkpoints/synthetic-gsm-llada-16m --out runs/train9 \
    --mesh data=2 --seq-len 320 --fit-to-time --max-minutes 14.2 \
    --steps 100000 --eval-every 1000 --ckpt-every 100000"
s9train_a() {
  rm -rf runs/train9
  $TRAIN9 --stop-after-minutes 7.6 > "$OUT/train9a.log" 2>&1
  ls runs/train9/checkpoints >> "$OUT/train9a.log" 2>&1
}
