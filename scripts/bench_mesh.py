"""Multi-GPU decoding: data-parallel throughput and tensor-parallel step time.

Random bf16 weights at the LLaDA-8B geometry, the fixed commit rule (every
strategy commits --per-step tokens per step, as in bench_strategies.py):

  (a) data parallel: tokens/s of --dp-batch rows per GPU on 1 GPU against
      mesh data=2 (twice the rows); target ratio >= 1.9.
  (b) tensor parallel: ms per decode step on mesh model=2 against 1 GPU, at
      batch 1 and 32.

Each mesh row also reports whether its tokens equal the 1-GPU tokens (bf16
tensor parallelism sums in another order, so near-ties may flip).

  python scripts/bench_mesh.py OUT/mesh.json   # 2 GPUs
  python scripts/bench_mesh.py --smoke /tmp/mesh.json         # tiny model
  (--smoke on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=2)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench_strategies import strategies  # noqa: E402
from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("json", type=Path, help="where to write the results")
  ap.add_argument("--strategy", default="flash-cache",
                  help="a bench_strategies.py strategy (default: %(default)s)")
  ap.add_argument("--dp-batch", type=int, default=16,
                  help="rows per GPU for the data-parallel comparison")
  ap.add_argument("--tp-batch", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--devices", type=int, default=2,
                  help="mesh size of both comparisons (default: 2)")
  ap.add_argument("--gen", type=int, default=256)
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--per-step", type=int, default=4)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--block-m", type=int, default=16)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--skip-data", action="store_true",
                  help="only the tensor-parallel comparison")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny model, any backend with >= --devices devices")
  args = ap.parse_args(argv)
  n = args.devices
  if args.smoke:
    cfg = ModelConfig.tiny("llada", dtype="bfloat16")
    args.dp_batch, args.tp_batch, args.gen, args.prompt = 2, [2, 4], 32, 16
    args.block, args.block_m, args.reps = 16, 8, 1
  else:
    cfg = ModelConfig.preset("llada-8b")
  if len(jax.local_devices()) < n:
    sys.exit(f"error: {n} devices needed, {len(jax.local_devices())} present")
  sampler = strategies(args.gen, args.per_step, args.block,
                       args.block_m)[args.strategy]()[0]
  t0 = time.perf_counter()
  params = timing.bench_params(cfg)
  one = None  # the baseline: no mesh, the default device
  print(f"{jax.local_devices()[0].device_kind} x {len(jax.local_devices())}; "
        f"jax {jax.__version__}; {args.strategy}, prompt {args.prompt}, gen "
        f"{args.gen}, {args.per_step} tokens per step; weights initialised in "
        f"{time.perf_counter() - t0:.1f} s", flush=True)

  def decode(spec, b):
    out = []
    s_step, compile_s, steps, forwards = timing.time_decode(
        cfg, params, sampler, b, args.prompt, args.reps, mesh=spec,
        outputs=out)
    return dict(mesh=spec, batch=b, steps=steps, ms_step=s_step * 1e3,
                decode_s=s_step * steps, compile_s=compile_s,
                tokens_per_s=b * args.gen / (s_step * steps),
                tokens=np.asarray(out[0][0]))

  def same(row, base):
    row["tokens_equal_1gpu"] = float(np.mean(
        row["tokens"] == base["tokens"][:row["batch"]]))

  rows, dp_ratio = [], None
  alone = {}  # batch -> its 1-GPU decode, made once
  if not args.skip_data:
    # (a) data parallel: the same rows per GPU, n times the batch.
    dp1 = alone[args.dp_batch] = decode(one, args.dp_batch)
    dpn = decode(f"data={n}", n * args.dp_batch)
    # the 1-GPU tokens of all rows
    big = alone[n * args.dp_batch] = decode(one, n * args.dp_batch)
    same(dpn, big)
    rows += [dict(dp1, kind="data", gpus=1), dict(dpn, kind="data", gpus=n)]
    dp_ratio = dpn["tokens_per_s"] / dp1["tokens_per_s"]
  # (b) tensor parallel: one batch on 1 GPU and split over n GPUs.
  tp = {}
  for b in args.tp_batch:
    base = alone[b] if b in alone else decode(one, b)
    split = decode(f"model={n}", b)
    same(split, base)
    rows += [dict(base, kind="model", gpus=1),
             dict(split, kind="model", gpus=n)]
    tp[b] = base["ms_step"] / split["ms_step"]

  print("\n| comparison | GPUs | mesh | batch | steps | ms/step | tokens/s "
        "| compile s | tokens = 1 GPU |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    r.pop("tokens")
    r["mesh"] = r["mesh"] or "none"
    eq = r.get("tokens_equal_1gpu")
    print(f"| {r['kind']} | {r['gpus']} | {r['mesh']} | {r['batch']} | "
          f"{r['steps']} | {r['ms_step']:.2f} | {r['tokens_per_s']:.0f} | "
          f"{r['compile_s']:.1f} | {'' if eq is None else f'{eq:.1%}'} |")
  if dp_ratio is not None:
    print(f"\ndata parallel: {n} GPUs / 1 GPU tokens/s = {dp_ratio:.2f} "
          f"(target >= {0.95 * n:.1f})")
  for b, speedup in tp.items():
    print(f"tensor parallel, batch {b}: 1 GPU ms/step / {n} GPUs ms/step = "
          f"{speedup:.2f}")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps(dict(
      device=jax.local_devices()[0].device_kind, jax=jax.__version__,
      strategy=args.strategy, prompt=args.prompt, gen=args.gen,
      per_step=args.per_step, devices=n, dp_tokens_per_s_ratio=dp_ratio,
      tp_step_speedup={str(b): s for b, s in tp.items()}, rows=rows,
      seconds=time.perf_counter() - t0), indent=1))
  print(f"wrote {args.json} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
  main()
