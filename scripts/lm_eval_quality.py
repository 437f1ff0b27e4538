#!/usr/bin/env python
"""The shipped model on the held-out synthetic GSM set through lm-eval,
beside the project's own eval of the same settings, per strategy.

  python scripts/lm_eval_quality.py --limit 1000 --batch-size 128   # GPU
  python scripts/lm_eval_quality.py --limit 16 --batch-size 16 \\
      --strategies llada threshold flash-dllm --gen-lengths 192      # CPU

For each (strategy, gen length), with eval_quality.py's sampler options
(LLaDA: steps = gen length, block 32; threshold / Fast-dLLM: block 32;
the others their defaults), 0-shot, chat template, seeds 0 + problem index:

- lm-eval: `simple_evaluate` of the `flash_dllm_jax` model on the task
  `synthetic_gsm` (lm-eval's gsm8k prompt, filters and metric): strict-match
  and flexible-extract accuracy, and the adapter's tokens/s and tokens/step;
- the project: eval/runner.py on the same problems (what eval_gsm8k.py
  --data data/synthetic_gsm --num-fewshot 0 --chat runs): its own accuracy
  ('####' else the last number, numerically), lm-eval's two scores of its
  records (flash_dllm_jax/lm_eval/scoring.py), tokens/s and tokens/step;
- whether the two produced the same answer texts.

Writes OUT/lm_eval_quality.md and OUT/lm_eval_quality.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from eval_quality import STRATEGIES, sampler_options  # noqa: E402
from flash_dllm_jax.cli import (DEFAULT_CHECKPOINT,  # noqa: E402
                                add_compile_cache_flags, start_compile_cache)


def _lm_eval_run(checkpoint, strategy, options, batch_size, limit, tm):
  import lm_eval
  args = {"checkpoint": str(checkpoint), "strategy": strategy,
          "batch_size": batch_size, "chat": True, **options}
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args=args, tasks=["synthetic_gsm"],
      task_manager=tm, limit=limit, log_samples=True)
  metrics = results["results"]["synthetic_gsm"]
  texts = {s["doc_id"]: s["resps"][0][0]
           for s in results["samples"]["synthetic_gsm"]}
  return ({"strict-match": metrics["exact_match,strict-match"],
           "flexible-extract": metrics["exact_match,flexible-extract"],
           "throughput": results["config"]["flash_dllm_jax"]["throughput"]
           ["generate_until"]}, texts)


def _project_run(model, strategy, options, batch_size, limit, out_dir):
  from flash_dllm_jax.eval.runner import run_eval
  from flash_dllm_jax.eval.tasks.gsm8k import GSM8K
  from flash_dllm_jax.lm_eval import scoring
  from flash_dllm_jax.strategies import build_sampler
  task = GSM8K(ROOT / "data" / "synthetic_gsm", num_fewshot=0, chat=True)
  sampler = build_sampler(strategy, model[1].arch, options)
  run_dir = out_dir / "project" / f"{strategy}-{options['gen_length']}"
  summary = run_eval(task, model, sampler, run_dir,
                     {"strategy": strategy, **options, "chat": True},
                     batch_size=batch_size, limit=limit, progress=False)
  records = [json.loads(x) for x in
             (run_dir / "records.jsonl").read_text().splitlines()]
  answers = {i: row["answer"] for i, row in enumerate(task.test)}
  by_index = {int(r["id"].split("/")[1]): r["output"] for r in records}
  lm_scores = scoring.accuracy((by_index[i], answers[i]) for i in by_index)
  return {"project": summary["score"], **lm_scores,
          "tokens_per_s": summary["tokens_per_s"],
          "tokens_per_step": summary["tokens_per_step"]}, by_index


def _pct(x):
  return "-" if x is None else f"{100 * x:.1f}%"


def _num(x):
  return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
  ap.add_argument("--gen-lengths", nargs="+", type=int, default=[192, 256])
  ap.add_argument("--batch-size", type=int, default=16)
  ap.add_argument("--limit", type=int, default=16)
  ap.add_argument("--out", type=Path, default=Path("runs/lm_eval_quality"))
  add_compile_cache_flags(ap)
  args = ap.parse_args(argv)
  start_compile_cache(args)

  import jax
  import flash_dllm_jax.lm_eval as fl
  from flash_dllm_jax.checkpoint import load
  tm, model = fl.task_manager(), load(args.checkpoint)
  rows, table = [], []
  for length in args.gen_lengths:
    for strategy in args.strategies:
      options = sampler_options(strategy, length)
      t0 = time.perf_counter()
      lm, lm_texts = _lm_eval_run(args.checkpoint, strategy, options,
                                  args.batch_size, args.limit, tm)
      own, own_texts = _project_run(model, strategy, options,
                                    args.batch_size, args.limit, args.out)
      same = sum(lm_texts[i] == own_texts.get(i) for i in lm_texts)
      rows.append({"strategy": strategy, "gen_length": length,
                   "options": options, "lm_eval": lm, "project": own,
                   "same_texts": same, "problems": len(lm_texts),
                   "seconds": time.perf_counter() - t0})
      tp = lm["throughput"]
      table.append("| " + " | ".join([
          strategy, str(length), str(len(lm_texts)),
          _pct(lm["strict-match"]), _pct(lm["flexible-extract"]),
          _num(tp["tokens_per_s"]), _num(tp["tokens_per_step"]),
          _pct(own["project"]), _pct(own["strict-match"]),
          _pct(own["flexible-extract"]), _num(own["tokens_per_s"]),
          _num(own["tokens_per_step"]), f"{same}/{len(lm_texts)}"]) + " |")
      print(table[-1], flush=True)
  head = ("| strategy | gen | n | lm-eval strict | lm-eval flexible | "
          "lm-eval tok/s | lm-eval tok/step | project acc | project strict | "
          "project flexible | project tok/s | project tok/step | same texts |")
  md = "\n".join([f"device: {jax.devices()[0].device_kind}, jax "
                  f"{jax.__version__}, checkpoint {args.checkpoint}, batch "
                  f"{args.batch_size}, limit {args.limit}", "", head,
                  "|" + "---|" * 13, *table, ""])
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "lm_eval_quality.md").write_text(md)
  (args.out / "lm_eval_quality.json").write_text(json.dumps(rows, indent=2))
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
