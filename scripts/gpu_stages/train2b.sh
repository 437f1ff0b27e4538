# Stage 'train2b' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run as
#   bash scripts/bench_suite.sh OUT_DIR train2b     # about 8 minutes
# right after train2a on the SAME, still warm machine (see train2a.sh): it
# resumes runs/train2 there, finishes the schedule, exports the bfloat16
# model, and runs the quality check (LLaDA sampler, first 256 held-out
# problems, gen 128 and 256). On a fresh machine it stops at once (exit 3).
# OUT gets 8 files: suite.log, train2b.log, metrics.jsonl, loss.png,
# quality.md, quality.log and the model as model.tar.aa + model.tar.ab
# (cat model.tar.* | tar -x  gives model/).
source scripts/gpu_stages/train2a.sh
train2b() {
  if ! ls -d runs/train2/checkpoints/step_* > /dev/null 2>&1; then
    echo "no paused run in runs/train2: a fresh machine (train2a's state" \
        "stays where it ran); run train2a and then train2b again" \
        | tee "$OUT/train2b.log"
    return 3
  fi
  $TRAIN2 --eval-problems 0 > "$OUT/train2b.log" 2>&1 || return 1
  cp runs/train2/metrics.jsonl runs/train2/loss.png "$OUT/"
  tar -cf - -C runs/train2 model | split -b 15M - "$OUT/model.tar."
  timeout 90 python scripts/eval_quality.py --checkpoint runs/train2/model \
      --strategies llada --limit 256 --gen-lengths 128 256 --no-progress \
      --out-dir runs/train2_quality > "$OUT/quality.log" 2>&1
  cp runs/train2_quality/quality.md "$OUT/" 2>> "$OUT/quality.log"
}
