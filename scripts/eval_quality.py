#!/usr/bin/env python
"""The quality table of BENCHMARKS.md: accuracy and tokens per step of every decoding
strategy at two generation lengths on the held-out synthetic GSM split, in
one process (imports, model and data load once; each strategy compiles per
generation length and prompt-length bucket).

  python scripts/eval_quality.py                                    # GPU
  python scripts/eval_quality.py --limit 8 --gen-lengths 64         # CPU

Each (strategy, length) is an ordinary run of flash_dllm_jax/eval/runner.py
(what `scripts/eval_gsm8k.py --data data/synthetic_gsm --num-fewshot 0
--chat` runs, same run directory names), so an interrupted table resumes
and OUT_DIR/results.md is eval_report's table over the runs. The combined
table and the targets (computed, never asserted) go to OUT_DIR/quality.md.

Settings: the LLaDA sampler with steps = gen length and block 32; threshold
decoding and Fast-dLLM (prefix / dual cache) with block 32 (shorter
generations: one block); Elastic-Cache, Flash-Cache (flash-cache) and
Flash-dLLM (flash-dllm: Flash-Cache + Flash-Verify) with their samplers'
defaults. "threshold" (the threshold commit rule, no cache) is the
baseline of the tokens-per-step ratio.

A canvas sampler (diffusion-gemma and its variants) takes the generation
length as its max_out_length, and its tok/step is tokens per denoising
pass. With neither llada nor threshold listed, accuracy and tokens per
step are compared to the first strategy listed:

  python scripts/eval_quality.py --checkpoint checkpoints/X \
      --strategies diffusion-gemma diffusion-gemma-flash

A strategy may carry sampler options: `flash-dllm:block_m=64` is Flash-dLLM
with a 64-position window; its flash-cache twin for the verify ratio is
`flash-cache:block_m=64`. Runs go where eval_gsm8k would put them (the
strategy's name plus a hash of all settings).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flash_dllm_jax import quantize  # noqa: E402
from flash_dllm_jax.cli import (DEFAULT_CHECKPOINT,  # noqa: E402
                                add_compile_cache_flags, start_compile_cache)

STRATEGIES = ("llada", "threshold", "fast-dllm-prefix", "fast-dllm-dual",
              "elastic-cache", "flash-cache", "flash-dllm")
BLOCK = 32
LLADA_TARGET, MAX_DROP, TPS_TARGET = 0.90, 1.0, 1.5  # 90%, 1 point, 1.5x
ANSWER_LENGTH = "max_out_length"  # the canvas samplers' generation length
# A variant kept only if it beats its base strategy's tokens per second
# (at equal quality: the within-1-point target): {variant: base}.
SPEED_TWINS = {"diffusion-gemma-flash": "diffusion-gemma"}


def sampler_options(strategy: str, gen_length: int) -> dict:
  """The options of a strategy at a generation length (the rest: the
  sampler dataclass's defaults)."""
  from flash_dllm_jax import strategies
  if strategy in strategies.STRATEGIES and "gen_length" not in (
      fields := strategies.sampler_options(
          strategies.STRATEGIES[strategy].sampler)) and (
              ANSWER_LENGTH in fields):
    return {ANSWER_LENGTH: gen_length}
  block = min(BLOCK, gen_length)
  if strategy == "llada":
    return {"gen_length": gen_length, "steps": gen_length,
            "block_length": block}
  if strategy in ("threshold", "fast-dllm-prefix", "fast-dllm-dual"):
    return {"gen_length": gen_length, "block_length": block}
  return {"gen_length": gen_length}


def compared_to(strategies, reference=None, baseline=None):
  """(reference, baseline): those given, else llada / threshold where
  listed, else the first strategy listed."""
  pick = lambda given, default: given or (
      default if default in strategies else strategies[0])
  return pick(reference, "llada"), pick(baseline, "threshold")


def parse_strategy(spec: str) -> tuple[str, dict]:
  """'flash-dllm:block_m=64,gamma=0.7' -> ('flash-dllm', {'block_m': 64,
  'gamma': 0.7}); values parse as int, float, true/false/none, or stay
  text."""
  name, _, rest = spec.partition(":")
  options = {}
  for item in filter(None, rest.split(",")):
    key, eq, text = item.partition("=")
    if not eq or not key:
      raise ValueError(f"strategy {spec!r}: options are key=value, got "
                       f"{item!r}")
    value = {"true": True, "false": False, "none": None}.get(text.lower(),
                                                            text)
    for cast in (int, float):
      try:
        value = cast(text)
        break
      except ValueError:
        pass
    options[key] = value
  return name, options


def _pct(x):
  return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, fmt, unit=""):
  return "-" if x is None else format(x, fmt) + unit


def quality_table(summaries: dict, lengths, strategies, reference="llada",
                  baseline="threshold") -> str:
  """Markdown: the table over {(strategy, gen length): summary} and the
  targets section (PASS / FAIL / n/a per target). Accuracy differences are
  to `reference`'s, tokens per step over `baseline`'s."""
  ref = "LLaDA" if reference == "llada" else reference
  cols = ["strategy", "gen len", "n", "accuracy",
          f"Δ acc vs {ref} (pts)", "tok/step",
          f"tok/step ÷ {baseline}", "tok/s"]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  targets = []
  for L in lengths:
    base, thr = summaries.get((reference, L)), summaries.get((baseline, L))
    acc = base["score"] if base else None
    targets.append((f"{'LLaDA sampler' if ref == 'LLaDA' else ref} >= "
                    f"{100 * LLADA_TARGET:g}% at gen {L}",
                    _pct(acc), None if acc is None else acc >= LLADA_TARGET))
    for name in strategies:
      s = summaries.get((name, L))
      if s is None:
        continue
      diff = ratio = None
      if (name != reference and base
          and None not in (s["score"], base["score"])):
        diff = round(100 * (s["score"] - base["score"]), 9) + 0.0  # no -0
      if thr and s["tokens_per_step"] and thr["tokens_per_step"]:
        ratio = round(s["tokens_per_step"] / thr["tokens_per_step"], 9)
      lines.append("| " + " | ".join([
          name, str(L), str(s["problems"]), _pct(s["score"]),
          _num(diff, "+.1f"), _num(s["tokens_per_step"], ".2f"),
          _num(ratio, ".2f", "x"),
          _num(s["tokens_per_s"], ".1f")]) + " |")
      base_name = parse_strategy(name)[0]
      if name != reference:
        ok = None if diff is None else diff >= -MAX_DROP
        targets.append((f"{name} within {MAX_DROP:g} point of {ref} "
                        f"at gen {L}", _num(diff, "+.1f", " pts"), ok))
      if base_name == "flash-dllm":
        ok = None if ratio is None else ratio >= TPS_TARGET
        targets.append((f"{name} tok/step >= {TPS_TARGET:g}x threshold "
                        f"at gen {L}", _num(ratio, ".2f", "x"), ok))
        # The other reading of "threshold decoding alone": the same
        # Flash-Cache window and threshold without the verify pass.
        twin = "flash-cache" + name[len("flash-dllm"):]
        fc = summaries.get((twin, L))
        own = (round(s["tokens_per_step"] / fc["tokens_per_step"], 9)
               if fc and s["tokens_per_step"] and fc["tokens_per_step"]
               else None)
        targets.append((f"{name} tok/step >= {TPS_TARGET:g}x {twin} "
                        f"(same window, no verify) at gen {L}",
                        _num(own, ".2f", "x"),
                        None if own is None else own >= TPS_TARGET))
      if base_name in SPEED_TWINS:
        # the base with the same options, else the base as listed plainly
        twin = SPEED_TWINS[base_name] + name[len(base_name):]
        if (twin, L) not in summaries:
          twin = SPEED_TWINS[base_name]
        tw = summaries.get((twin, L))
        speed = (round(s["tokens_per_s"] / tw["tokens_per_s"], 9)
                 if tw and s["tokens_per_s"] and tw["tokens_per_s"] else None)
        targets.append((f"{name} tok/s > {twin}'s at gen {L}",
                        _num(speed, ".2f", "x"),
                        None if speed is None else speed > 1))
  verdict = {True: "PASS", False: "FAIL", None: "n/a (not run)"}
  out = lines + ["", "Δ acc: accuracy minus "
                 f"{'the LLaDA sampler' if ref == 'LLaDA' else ref}'s at the same "
                 f"length, in percentage points. tok/step ÷ {baseline}: "
                 f"tokens per step over {baseline}'s at the same "
                 "length. tok/s excludes JAX compilation.", "", "## Targets",
                 "", "| target | value | result |", "|---|---|---|"]
  out += [f"| {t} | {v} | {verdict[ok]} |" for t, v, ok in targets]
  passed = sum(ok is True for _, _, ok in targets)
  out += ["", f"targets passed: {passed}/{len(targets)}"]
  return "\n".join(out) + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--data", type=Path, default=ROOT / "data" / "synthetic_gsm")
  ap.add_argument("--limit", type=int, default=None,
                  help="first N problems (default: all)")
  ap.add_argument("--gen-lengths", type=int, nargs="+", default=[128, 256])
  ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
  ap.add_argument("--reference", default=None,
                  help="the strategy (as listed) accuracy is compared to "
                  "(default: llada if listed, else the first listed)")
  ap.add_argument("--baseline", default=None,
                  help="the strategy (as listed) tokens per step are "
                  "divided by (default: threshold if listed, else the "
                  "first listed)")
  ap.add_argument("--batch-size", type=int, default=128,
                  help="rows per batch (capped at the problem count)")
  ap.add_argument("--mesh", default=None, help="as eval_gsm8k's --mesh")
  quantize.add_flags(ap)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out-dir", type=Path, default=Path("runs/eval/quality"))
  ap.add_argument("--no-progress", dest="progress", action="store_false")
  add_compile_cache_flags(ap)
  args = ap.parse_args(argv)
  args.reference, args.baseline = compared_to(args.strategies, args.reference,
                                              args.baseline)

  from flash_dllm_jax import parallel
  from flash_dllm_jax.checkpoint import load, load_config, quantized_config
  from flash_dllm_jax.eval import report, runner
  from flash_dllm_jax.strategies import build_sampler
  from flash_dllm_jax.eval.tasks.gsm8k import GSM8K

  t0 = time.perf_counter()
  try:
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
      raise ValueError("--batch-size and --limit must be >= 1")
    parallel.initialize_distributed()
    start_compile_cache(args)
    mesh = parallel.parse_mesh(args.mesh)
    config = quantized_config(load_config(args.checkpoint), args.quantize,
                              args.quantize_head, str(args.checkpoint),
                              embedding=args.quantize_embedding)
    samplers = {}
    for L in args.gen_lengths:
      for spec in args.strategies:
        name, options = parse_strategy(spec)
        samplers[spec, L] = build_sampler(
            name, config.arch, {**sampler_options(name, L), **options})
    task = GSM8K(args.data, num_fewshot=0, chat=True)
    batch = min(args.batch_size, args.limit or len(task.test), len(task.test))
    model = load(args.checkpoint, mesh=mesh, quantize=args.quantize,
                 quantize_head=args.quantize_head,
                 quantize_embedding=args.quantize_embedding)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  summaries = {}
  for (spec, L), sampler in samplers.items():
    name = parse_strategy(spec)[0]
    # The settings eval_gsm8k's CLI records (so the run names agree).
    settings = {"task": task.name,
                "checkpoint": str(args.checkpoint.absolute()),
                "arch": config.arch, "dtype": config.dtype, "strategy": name,
                **({"quantize": config.quantize,
                    "quantize_head": config.quantize_head,
                    **({"quantize_embedding": True}
                       if config.quantize_embedding else {})}
                   if config.quantize else {}),
                "sampler": dataclasses.asdict(sampler), "batch_size": batch,
                "seed": args.seed, "stop_at_eos": True, **task.settings()}
    run_dir = args.out_dir / runner.run_name(name, settings)
    print(f"{spec} gen {L}: {run_dir}", file=sys.stderr)
    summaries[spec, L] = runner.run_eval(
        task, model, sampler, run_dir, settings, batch_size=batch,
        limit=args.limit, seed=args.seed, progress=args.progress, mesh=mesh)
  if parallel.process_index() != 0:  # process 0 merges and reports
    return 0
  report.write_report(args.out_dir)
  table = quality_table(summaries, args.gen_lengths, args.strategies,
                        args.reference, args.baseline)
  header = (f"# Quality: {args.checkpoint.name} on {args.data.name} "
            f"(0-shot, chat), {batch} rows per batch\n\n")
  (args.out_dir / "quality.md").write_text(header + table)
  print(header + table)
  print(f"table {args.out_dir / 'quality.md'}; per-run table "
        f"{args.out_dir / report.TABLE}; {time.perf_counter() - t0:.0f} s",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
