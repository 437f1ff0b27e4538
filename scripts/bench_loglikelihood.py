"""lm-eval's Monte-Carlo log-likelihood (flash_dllm_jax/likelihood.py):
ms per request and per noisy copy at several batch sizes.

A multiple-choice workload: --requests continuations of --target tokens
after --prefix tokens (random ids), --mc-num copies each in stratified
groups of --mc-group, scored by `likelihood.estimate_many` batch_size rows
per forward, the way the lm-eval model runs them. The model: random bf16
weights at LLaDA-8B (--arch llada) or Dream-7B (--arch dream) shapes, or a
converted checkpoint (--checkpoint, e.g. the shipped model). Time excludes
the first call (compilation); the scores of every batch size are compared
with the first one's (on a GPU a row's bits may change with the batch).
Peak GB is the device's peak so far in the run (weights included).

  python scripts/bench_loglikelihood.py --arch llada --batch 1 8 32 128
  python scripts/bench_loglikelihood.py --checkpoint checkpoints/synthetic-gsm-llada-16m
  python scripts/bench_loglikelihood.py --smoke          # tiny model, any backend
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax.compilation import compile_clock  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax import likelihood  # noqa: E402


def workload(config: ModelConfig, n: int, prefix: int, target: int,
             mc_num: int, group: int, seed: int = 0):
  """n requests of random ids (never the mask token) with their masks."""
  rng = np.random.default_rng(seed)
  high = min(config.vocab_size, config.mask_token_id)
  out = []
  for i in range(n):
    ids = rng.integers(0, high, prefix + target).tolist()
    masks, weights = likelihood.draw_masks(
        np.random.default_rng((seed, i)), target, mc_num, group,
        config.spec.likelihood_masks)
    out.append(likelihood.Request(ids[:prefix], ids[prefix:], masks, weights))
  return out


def _model(args):
  if args.checkpoint is not None:
    from flash_dllm_jax.checkpoint import load
    params, config, _ = load(args.checkpoint, dtype=args.dtype)
    return params, config, str(args.checkpoint)
  if args.smoke:
    config = ModelConfig.tiny(args.arch, dtype="bfloat16")
    name = f"tiny random {args.arch}"
  else:
    llada = args.arch == "llada"
    config = ModelConfig.preset("llada-8b" if llada else "dream-7b")
    shapes = "LLaDA-8B" if llada else "Dream-7B"
    name = f"random bf16 weights at {shapes} shapes"
  return timing.bench_params(config), config, name


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--arch", choices=("llada", "dream"), default="llada")
  ap.add_argument("--checkpoint", type=Path, default=None,
                  help="a converted checkpoint instead of random weights")
  ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                  help="--checkpoint's compute dtype (default: its own)")
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
  ap.add_argument("--requests", type=int, default=8)
  ap.add_argument("--prefix", type=int, default=480,
                  help="context tokens per request")
  ap.add_argument("--target", type=int, default=8,
                  help="continuation tokens per request")
  ap.add_argument("--mc-num", type=int, default=128)
  ap.add_argument("--mc-group", type=int, default=32)
  ap.add_argument("--cfg", type=float, default=0.0)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)
  if args.smoke:
    args.batch, args.requests, args.prefix, args.target = [1, 4], 3, 20, 3
    args.mc_num, args.mc_group, args.reps = 8, 4, 1
  for name in ("requests", "prefix", "target", "mc_num", "mc_group", "reps"):
    if getattr(args, name) < 1 or min(args.batch) < 1:
      ap.error(f"--{name.replace('_', '-')} and --batch must be >= 1")
  if args.mc_num % args.mc_group:
    ap.error("--mc-num must be a multiple of --mc-group")
  params, config, name = _model(args)
  if args.prefix + args.target > config.max_seq_len:
    ap.error(f"--prefix + --target exceed max_seq_len {config.max_seq_len}")
  reqs = workload(config, args.requests, args.prefix, args.target,
                  args.mc_num, args.mc_group)
  copies = args.requests * args.mc_num
  print(f"{name}; device {jax.devices()[0].device_kind}; jax "
        f"{jax.__version__}; {args.requests} requests of {args.prefix} + "
        f"{args.target} tokens, {args.mc_num} copies each (groups of "
        f"{args.mc_group}), cfg {args.cfg}", flush=True)
  rows, first = [], None
  for b in args.batch:
    run = lambda: likelihood.estimate_many(params, config, reqs, batch_size=b,
                                           cfg=args.cfg)
    with compile_clock() as compiled:
      t0 = time.perf_counter()
      values, _ = run()
      first_s = time.perf_counter() - t0
    times = []
    for _ in range(args.reps):
      t0 = time.perf_counter()
      run()  # returns host numbers: the device work is done
      times.append(time.perf_counter() - t0)
    wall = float(np.median(times))
    first = values if first is None else first
    rows.append(dict(batch=b, ms_request=wall / args.requests * 1e3,
                     ms_copy=wall / copies * 1e3,
                     forwards=-(-copies // b), first_call_s=first_s,
                     compile_s=compiled[0],
                     max_abs_diff=float(np.max(np.abs(values - first))),
                     peak_gb=(timing.peak_memory_bytes() or 0) / 1e9))
    print(rows[-1], flush=True)
    if args.json:
      args.json.write_text(json.dumps(dict(
          model=name, device=jax.devices()[0].device_kind,
          settings={k: str(v) if isinstance(v, Path) else v
                    for k, v in vars(args).items()}, rows=rows), indent=1))
  print(f"\n| batch | ms/request | ms/copy | forwards | first call s | "
        f"compile s | max |Δ score| vs batch {args.batch[0]} | peak GB |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['batch']} | {r['ms_request']:.1f} | {r['ms_copy']:.3f} | "
          f"{r['forwards']} | {r['first_call_s']:.1f} | {r['compile_s']:.1f} "
          f"| {r['max_abs_diff']:.3g} | {r['peak_gb']:.1f} |")


if __name__ == "__main__":
  main()
