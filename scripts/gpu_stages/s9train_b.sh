# Stage 's9train_b' of scripts/bench_suite.sh (sourced there: OUT is set, the
# working directory is the repository root). Run right after s9train_a on
# the SAME warm machine: it resumes runs/train9, finishes the schedule,
# exports the bfloat16 model and checks it on the first 256 held-out
# problems at gen 192 (LLaDA sampler, threshold decoding, Flash-Cache,
# Flash-dLLM). On a fresh machine it stops at once (exit 3).
# OUT gets: suite.log, train9b.log, metrics.jsonl, loss.png, check.tgz
# (quality table and log) and the model as model.tar.aa + model.tar.ab
# (cat model.tar.* | tar -x  gives model/).
source scripts/gpu_stages/s9train_a.sh
s9train_b() {
  if ! ls -d runs/train9/checkpoints/step_* > /dev/null 2>&1; then
    echo "no paused run in runs/train9: a fresh machine; run s9train_a" \
        "and then s9train_b again" | tee "$OUT/train9b.log"
    return 3
  fi
  $TRAIN9 --eval-problems 0 > "$OUT/train9b.log" 2>&1 || return 1
  cp runs/train9/metrics.jsonl runs/train9/loss.png "$OUT/"
  tar -cf - -C runs/train9 model | split -b 15M - "$OUT/model.tar."
  timeout 100 python scripts/eval_quality.py --checkpoint runs/train9/model \
      --strategies llada threshold flash-cache flash-dllm --limit 256 \
      --gen-lengths 192 --no-progress --out-dir runs/train9_check \
      > runs/train9_check.log 2>&1
  cp runs/train9_check.log runs/train9_check/ 2>/dev/null
  tar -czf "$OUT/check.tgz" -C runs train9_check
}
