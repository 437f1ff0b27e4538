"""Continuous batching against static batches on the shipped model.

The same held-out synthetic GSM problems through B decoding slots, two ways:
static batches of B (one `generate` call per batch; a batch runs until its
slowest row is done) and continuous batching (one call; a finished slot takes
the next problem inside the compiled loop). Reports host round trips, loop
steps (each one forward over all B slots), slot occupancy (row steps / (loop
steps x B)), wall time and tokens/s, and checks that every way gives the
same answers (rows must not depend on their batch: the script exits with an
error if one does). Each way runs twice and the second, compiled run is
timed. --max-refills adds continuous runs that admit at most that many new
requests per loop step and prefill only those rows.

  python scripts/bench_continuous.py --problems 64 --slots 8 --gen-length 128
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import flash_dllm_jax  # noqa: E402
from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.eval.runner import answer_length  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402


def run(model, questions, sampler, slots, continuous):
  """(texts, generate calls, loop steps, row steps, tokens, seconds)."""
  stops = model[1].stop_token_ids
  t0 = time.perf_counter()
  if continuous:
    outs = [flash_dllm_jax.generate(model, questions, chat=True,
                                    sampler=sampler, batch_size=slots)]
  else:
    outs = [flash_dllm_jax.generate(model, questions[i:i + slots], chat=True,
                                    sampler=sampler)
            for i in range(0, len(questions), slots)]
  seconds = time.perf_counter() - t0
  return dict(texts=[t for o in outs for t in o.texts], calls=len(outs),
              loop_steps=sum(int(o.steps) for o in outs),
              row_steps=sum(int(np.sum(o.steps_B)) for o in outs),
              tokens=sum(answer_length(row, stops) for o in outs
                         for row in o.tokens_BxG),
              seconds=seconds)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--data", type=Path,
                  default=ROOT / "data" / "synthetic_gsm" / "test.jsonl")
  ap.add_argument("--problems", type=int, default=64)
  ap.add_argument("--slots", type=int, default=8)
  ap.add_argument("--strategy", default="flash-dllm")
  ap.add_argument("--gen-length", type=int, default=128)
  ap.add_argument("--max-refills", type=int, nargs="*", default=[],
                  help="also run continuous batching with these caps on the "
                       "new requests per loop step (Flash-dLLM max_refills)")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)
  if not 1 <= args.slots < args.problems:
    ap.error(f"need 1 <= --slots < --problems, got {args.slots}, "
             f"{args.problems}")
  rows = [json.loads(line) for line in
          args.data.read_text().splitlines()[:args.problems]]
  questions = [r["question"] for r in rows]
  model = flash_dllm_jax.load(args.checkpoint)
  sampler = build_sampler(args.strategy, model[1].arch,
                          {"gen_length": args.gen_length})
  uncapped = dataclasses.replace(sampler, max_refills=None)
  ways = [("static", sampler, False), ("continuous", uncapped, True)] + [
      (f"continuous, max_refills {r}",
       dataclasses.replace(sampler, max_refills=r), True)
      for r in args.max_refills]
  result = {}
  for name, way_sampler, continuous in ways:
    run(model, questions, way_sampler, args.slots, continuous)  # compiles
    result[name] = run(model, questions, way_sampler, args.slots, continuous)
  static = result["static"]["texts"]
  for r in result.values():
    r["answers_differing_from_static"] = sum(
        a != b for a, b in zip(r["texts"], static))
  same = all(r["answers_differing_from_static"] == 0
             for r in result.values())
  print(f"{jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"{args.strategy}, {args.problems} problems, {args.slots} slots, "
        f"gen {args.gen_length}; same answers every way: {same}\n")
  print("| batching | generate calls | loop steps | slot occupancy | "
        "tokens | seconds | tokens/s | ÷ static | answers ≠ static |")
  print("|---|---|---|---|---|---|---|---|---|")
  base = result["static"]["tokens"] / result["static"]["seconds"]
  for name, r in result.items():
    r["occupancy"] = r["row_steps"] / (r["loop_steps"] * args.slots)
    r["tokens_per_s"] = r["tokens"] / r["seconds"]
    r["ratio"] = r["tokens_per_s"] / base
    print(f"| {name} | {r['calls']} | {r['loop_steps']} | "
          f"{r['occupancy']:.0%} | {r['tokens']} | {r['seconds']:.2f} | "
          f"{r['tokens_per_s']:.0f} | {r['ratio']:.2f} | "
          f"{r['answers_differing_from_static']} |")
  if args.json:
    for r in result.values():
      r.pop("texts")
    args.json.write_text(json.dumps(dict(
        device=jax.devices()[0].device_kind, jax=jax.__version__,
        strategy=args.strategy, problems=args.problems, slots=args.slots,
        gen_length=args.gen_length, same_answers=same, ways=result),
        indent=1))
  if not same:
    sys.exit("error: some answers depend on how the problems were batched")


if __name__ == "__main__":
  main()
