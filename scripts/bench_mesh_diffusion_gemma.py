"""DiffusionGemma's denoising pass on meshes against one device: bits, time.

Random weights at the DiffusionGemma_26B_A4B geometry (bench_diffusion_
gemma.py's, bf16 or --quantize fp8|int8) cut to its first --layers layers
(6: five local and one global; one device must hold the weights beside
their shards), a cache of --prompt slots (random K/V) and a canvas of
--canvas tokens: the self-conditioned canvas pass (diffusion_gemma/fast.py
at the decode loop's XLA options) on one device, then on each --mesh.
Per mesh and batch, measured in this run:

- `same`: whether the logits and the written cache equal one device's
  bit for bit (else how many logits differ and by how much at most);
- ms per pass (median of --reps) and its ratio to one device's;
- the per-device read floor: the pass's bytes (bench_diffusion_gemma.
  floor_bytes at batch/D) / M at the copy rate measured now (a lower
  bound: the replicated norms, router and embedding are counted split);
- peak device memory, the largest over the mesh's devices
  (`memory_stats()`: since the start, so device 0's includes the
  one-device runs).

  python scripts/bench_mesh_diffusion_gemma.py --json OUT/dg_mesh.json
  XLA_FLAGS=--xla_force_host_platform_device_count=4 \
      python scripts/bench_mesh_diffusion_gemma.py --smoke   # tiny, CPU
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
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import bench_diffusion_gemma as bdg  # noqa: E402
from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax import parallel  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma import fast  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma import model as M  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma.config import (  # noqa: E402
    GemmaConfig, preset)
from flash_dllm_jax.compilation import compiler_options  # noqa: E402


def inputs(config, b: int, prompt: int, c: int):
  """(tokens, slots, cache, sc) of a canvas pass at slots prompt ..
  prompt + c - 1, on the host."""
  rng = np.random.default_rng(0)
  cache = jax.tree.map(
      lambda a: rng.normal(size=a.shape).astype(jnp.bfloat16),
      jax.eval_shape(lambda: M.empty_cache(config, b, prompt + c,
                                           jnp.bfloat16)))
  tokens = rng.integers(0, config.vocab_size, (b, c)).astype(np.int32)
  slots = np.broadcast_to(prompt + np.arange(c, dtype=np.int32), (b, c))
  sc = rng.normal(size=(b, c, config.d_model)).astype(jnp.bfloat16)
  return tokens, np.ascontiguousarray(slots), cache, sc


def run_pass(config, params, mesh, args_host, reps: int):
  """(logits, cache after one pass, median seconds a pass, peak bytes)."""
  def put(a, spec=P("data")):
    return jnp.asarray(a) if mesh is None else jax.device_put(
        a, NamedSharding(mesh, spec))
  tokens, slots, cache, sc = args_host
  m = parallel.model_size(mesh)
  # the cache split by kv heads where they divide (as the pass writes it)
  cache = jax.tree.map(lambda a: put(a, parallel.CACHE_SPEC if a.shape[2] % m
                                     == 0 else P("data")), cache)
  tokens, slots, sc = put(tokens), put(slots), put(sc)
  fn = jax.jit(lambda p, t, s, c, x: fast.forward(p, config, t, s, c,
                                                  M.canvas(s), x),
               donate_argnums=(3,), compiler_options=compiler_options())
  with parallel.use(mesh):
    compiled = fn.lower(params, tokens, slots, cache, sc).compile()
  state = {"cache": cache}

  def call():  # the cache written in place, as in the decode loop
    logits, state["cache"] = compiled(params, tokens, slots, state["cache"],
                                      sc)
    return logits
  out = (np.asarray(call()), jax.tree.map(np.asarray, state["cache"]))
  seconds = timing.time_fn(call, reps=reps, warmup=1)
  devices = jax.devices()[:1] if mesh is None else mesh.devices.ravel()
  peak = max((d.memory_stats() or {}).get("peak_bytes_in_use", 0)
             for d in devices)
  return (*out, seconds, peak or None)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--mesh", nargs="+", default=["model=2", "data=2"])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--prompt", type=int, default=768)
  ap.add_argument("--canvas", type=int, default=256)
  ap.add_argument("--layers", type=int, default=6)
  ap.add_argument("--quantize", choices=("fp8", "int8"), default=None)
  ap.add_argument("--reps", type=int, default=8)
  ap.add_argument("--smoke", action="store_true",
                  help="tiny model and shapes: checks the script runs")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)
  if args.smoke:
    config = GemmaConfig.from_official(bdg.TINY, dtype="bfloat16")
    args.batch, args.prompt, args.canvas, args.reps = [2], 12, 6, 2
    copy_Bps = timing.copy_bandwidth(0.01, 3)
  else:
    config = preset(bdg.PRESET)
    copy_Bps = timing.copy_bandwidth()
  config = config.replace(layer_kinds=config.layer_kinds[:args.layers],
                          quantize=args.quantize)
  params = bdg.bench_params(config, args.quantize)
  device = jax.devices()[0]
  print(f"device: {device.device_kind} x {len(jax.devices())}; jax "
        f"{jax.__version__}; {args.layers} layers, weights "
        f"{args.quantize or 'bf16'} {bdg.nbytes(params) / 1e9:.2f} GB; copy "
        f"{copy_Bps / 1e9:.1f} GB/s measured now")
  print("| mesh | batch | same bits | ms/pass | vs 1 device | read floor ms "
        "| peak GB |")
  print("|---|---|---|---|---|---|---|")
  rows = []
  for b in args.batch:
    host = inputs(config, b, args.prompt, args.canvas)
    one = run_pass(config, params, None, host, args.reps)
    for spec in [None] + args.mesh:
      mesh = parallel.parse_mesh(spec)
      d, m = parallel.data_size(mesh), parallel.model_size(mesh)
      if b % d:
        continue
      if mesh is None:
        got = one
      else:
        parallel.check_config(config, mesh)
        got = run_pass(config, parallel.shard_params(mesh, config, params),
                       mesh, host, args.reps)
      diff = np.abs(got[0] - one[0])
      same = bool(np.array_equal(got[0], one[0]) and all(jax.tree.leaves(
          jax.tree.map(np.array_equal, got[1], one[1]))))
      floor_s = bdg.floor_bytes(config, params, b // d, args.prompt,
                                args.canvas) / m / copy_Bps
      row = dict(mesh=spec or "1 device", batch=b, same_bits=same,
                 logits_differing=int((diff > 0).sum()),
                 max_logit_diff=float(diff.max()), ms_per_pass=got[2] * 1e3,
                 vs_one_device=one[2] / got[2], read_floor_ms=floor_s * 1e3,
                 peak_gb=None if got[3] is None else got[3] / 1e9)
      rows.append(row)
      bits = "yes" if same else (f"no ({row['logits_differing']} logits, "
                                 f"max {row['max_logit_diff']:.3g})")
      peak = "-" if row["peak_gb"] is None else f"{row['peak_gb']:.1f}"
      print(f"| {row['mesh']} | {b} | {bits} | {row['ms_per_pass']:.2f} | "
            f"{row['vs_one_device']:.2f}x | {row['read_floor_ms']:.2f} | "
            f"{peak} |", flush=True)
      if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(
            device=device.device_kind, jax=jax.__version__,
            layers=args.layers, weights=args.quantize or "bf16",
            prompt=args.prompt, canvas=args.canvas, rows=rows), indent=1))
  return rows


if __name__ == "__main__":
  main()
