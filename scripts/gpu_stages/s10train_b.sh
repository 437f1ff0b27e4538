# Stage 's10train_b' of scripts/bench_suite.sh (sourced there: OUT is set,
# the working directory is the repository root). Run right after s10train_a
# on the SAME warm machine: it resumes runs/train10, finishes the schedule,
# exports the bfloat16 model and runs issue 6's quality table on all 1000
# held-out problems (stage s10quality). On a fresh machine it stops at once
# (exit 3).
# OUT gets: suite.log, train10b.log, metrics.jsonl, loss.png, q10.tgz and
# the model as model.tar.aa + model.tar.ab (cat model.tar.* | tar -x).
source scripts/gpu_stages/s10train_a.sh
source scripts/gpu_stages/s10quality.sh
s10train_b() {
  if ! ls -d runs/train10/checkpoints/step_* > /dev/null 2>&1; then
    echo "no paused run in runs/train10: a fresh machine; run s10train_a" \
        "and then s10train_b again" | tee "$OUT/train10b.log"
    return 3
  fi
  $TRAIN10 --eval-problems 0 > "$OUT/train10b.log" 2>&1 || return 1
  cp runs/train10/metrics.jsonl runs/train10/loss.png "$OUT/"
  tar -cf - -C runs/train10 model | split -b 15M - "$OUT/model.tar."
  tail -n 3 "$OUT/train10b.log"
  CHECKPOINT=runs/train10/model s10quality
}
