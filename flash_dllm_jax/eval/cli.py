"""Command line for evaluation: `gsm8k`, `humaneval` and `report`.

  python scripts/eval_gsm8k.py --checkpoint DIR --strategy llada \\
      --batch-size 8 --gen-length 256 --steps 256 --block-length 32
  python scripts/eval_humaneval.py --checkpoint DIR --limit 20 --chat
  python scripts/eval_report.py runs/eval/gsm8k

Each run lives in OUT_DIR/RUN_NAME (default: runs/eval/<task>/<strategy>-
<hash of the settings>), so rerunning an interrupted command resumes it.
After a run, OUT_DIR/results.md and the plot cover every run in OUT_DIR.

Started as several processes (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID, or Slurm / Open MPI), each process decodes its share of the
problems on its own devices (--mesh applies per process) into the shared
run directory, and process 0 merges them (eval/runner.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from flash_dllm_jax import parallel
from flash_dllm_jax.checkpoint import load, load_config
from flash_dllm_jax.cli_flags import (DEFAULT_CHECKPOINT,
                                      add_compile_cache_flags,
                                      start_compile_cache)
from flash_dllm_jax.eval import report, runner, sandbox
from flash_dllm_jax.eval.executor import Limits
from flash_dllm_jax.eval.tasks.gsm8k import DEFAULT_DATA, GSM8K
from flash_dllm_jax.eval.tasks.humaneval import HumanEval
from flash_dllm_jax.strategies import STRATEGIES, build
from flash_dllm_jax.strategy_flags import add_option_flags, options_from_args


def _add_common(ap: argparse.ArgumentParser) -> None:
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT,
                  help="converted checkpoint directory (default: %(default)s)")
  ap.add_argument("--data", type=Path, default=None,
                  help="dataset location (default: the shipped copy)")
  ap.add_argument("--strategy", default=None,
                  help=f"decoding strategy: {', '.join(STRATEGIES)} "
                  "(default: the checkpoint's reference sampler)")
  ap.add_argument("--batch-size", type=int, default=1)
  ap.add_argument("--mesh", default=None,
                  help="device mesh per process: data=D splits each batch, "
                       "model=M the weights and KV cache (tensor parallel), "
                       "e.g. data=4,model=2 (data= leaves every answer as "
                       "on one device; model= splits output-projection sums "
                       "and can flip near-tied tokens)")
  ap.add_argument("--limit", type=int, default=None,
                  help="evaluate only the first N problems")
  ap.add_argument("--chat", action=argparse.BooleanOptionalAction,
                  default=False, help="use the checkpoint's chat template")
  ap.add_argument("--seed", type=int, default=0,
                  help="base seed; problem i uses seed + i")
  ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                  help="compute dtype (default: the checkpoint's)")
  ap.add_argument("--no-stop-at-eos", dest="stop_at_eos", action="store_false",
                  help="decode every position even after EOS")
  ap.add_argument("--out-dir", type=Path, default=None,
                  help="where runs go (default: runs/eval/<task>)")
  ap.add_argument("--run-name", default=None,
                  help="run directory name (default: strategy + settings hash)")
  ap.add_argument("--no-progress", dest="progress", action="store_false")
  add_compile_cache_flags(ap)
  add_option_flags(ap)


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m flash_dllm_jax.eval")
  sub = ap.add_subparsers(dest="task", required=True)
  gsm = sub.add_parser("gsm8k", help="GSM8K accuracy (lm-eval format)")
  _add_common(gsm)
  gsm.add_argument("--num-fewshot", type=int, default=5,
                   help="exemplars from the train split (default: 5)")
  he = sub.add_parser("humaneval", help="HumanEval pass@1")
  _add_common(he)
  he.add_argument("--timeout", type=float, default=10.0,
                  help="seconds per test run (wall; CPU capped too)")
  he.add_argument("--memory-mb", type=int, default=1024,
                  help="address-space limit of a test run")
  he.add_argument("--sandbox", choices=sandbox.SANDBOXES,
                  default="bwrap", help="how generated code is confined: "
                  "bubblewrap (own user, no network, no host files but the "
                  "system's and the interpreter's, read-only; own PIDs), "
                  "required unless rlimit, resource limits alone, is asked "
                  "for (see docs/evaluation.md)")
  he.add_argument("--max-processes", type=int, default=64,
                  help="processes a test program may run at once")
  he.add_argument("--workers", type=int, default=None,
                  help="test runs at a time (default: CPU count)")
  rep = sub.add_parser("report", help="table and plot over runs in a folder")
  rep.add_argument("out_dir", type=Path)
  return ap


def _positive(name: str, value, minimum: int = 1) -> None:
  if value is not None and value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _make_task(args):
  if args.task == "gsm8k":
    return GSM8K(args.data or DEFAULT_DATA, args.num_fewshot, chat=args.chat)
  _positive("--workers", args.workers)
  limits = Limits(args.timeout, args.memory_mb, processes=args.max_processes,
                  sandbox=args.sandbox)
  return HumanEval(args.data, limits, args.workers, chat=args.chat)


def _evaluate(args) -> int:
  _positive("--batch-size", args.batch_size)
  parallel.initialize_distributed()
  mesh = parallel.parse_mesh(args.mesh)
  _positive("--limit", args.limit)
  if args.run_name is not None and (not args.run_name or "/" in args.run_name):
    raise ValueError(f"--run-name must be a plain name, got {args.run_name!r}")
  options = options_from_args(args)
  config = load_config(args.checkpoint)
  strategy = args.strategy or config.spec.default_strategy
  # temperature / top_p / top_k of a strategy without such fields: per row
  sampler, sampling = build(strategy, config.arch, options)
  task = _make_task(args)
  settings = {"task": task.name, "checkpoint": str(args.checkpoint.absolute()),
              "arch": config.arch, "dtype": args.dtype or config.dtype,
              "strategy": strategy, "sampler": dataclasses.asdict(sampler),
              "batch_size": args.batch_size, "seed": args.seed,
              "stop_at_eos": args.stop_at_eos, **task.settings()}
  if sampling is not None:
    settings["sampling"] = dataclasses.asdict(sampling)
  out_dir = args.out_dir or Path("runs") / "eval" / task.name
  run_dir = out_dir / (args.run_name or runner.run_name(strategy, settings))
  start_compile_cache(args)
  model = load(args.checkpoint, dtype=args.dtype, mesh=mesh)
  print(f"run: {run_dir}", file=sys.stderr)
  try:
    summary = runner.run_eval(task, model, sampler, run_dir, settings,
                              batch_size=args.batch_size, limit=args.limit,
                              seed=args.seed, stop_at_eos=args.stop_at_eos,
                              progress=args.progress, mesh=mesh,
                              sampling=sampling)
  except KeyboardInterrupt:
    print(f"\ninterrupted: finished problems are saved in {run_dir}; rerun "
          "the same command to resume", file=sys.stderr)
    return 130
  if summary is None:  # not process 0: it merges and reports
    print(f"process {parallel.process_index()}: problems saved in {run_dir}",
          file=sys.stderr)
    return 0
  table_path, plot_path, table = report.write_report(out_dir)
  print(table)
  failed = (f" ({summary['undecodable']} undecodable, see their records' "
            "error)" if summary["undecodable"] else "")
  print(f"{task.metric} {summary['correct']}/{summary['problems']}{failed}; "
        f"records {run_dir / 'records.jsonl'}; summary "
        f"{run_dir / 'summary.json'}; table {table_path}; plot {plot_path}",
        file=sys.stderr)
  return 0


def main(argv: list[str] | None = None) -> int:
  args = parser().parse_args(argv)
  try:
    if args.task == "report":
      table_path, plot_path, table = report.write_report(args.out_dir)
      print(table)
      print(f"table {table_path}; plot {plot_path}", file=sys.stderr)
      return 0
    return _evaluate(args)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
