"""Timing, roofline counts and tiling searches for scripts/bench_kernels.py.

`timeit` times an op inside one jitted loop (see its docstring).

Roofline: an op can't run faster than moving its bytes at the measured copy
bandwidth, nor than doing its FLOPs at the measured bf16 matmul rate;
roofline_us is the larger of the two and `bound` says which ("mem"/"flop").

Tuning: `attention_configs` / `matmul_configs` list up to `limit` concrete
tilings of one shape (keyword arguments of the Pallas kernels): the kernel's
default first, then each knob changed alone, then seeded random combinations.
`tune` times them and keeps the fastest whose output still matches.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
import zlib

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.attention import tiling as attn_tiling
from pallas_kernels.common import next_pow2
from pallas_kernels.matmul import kernel as mm_kernel


def timeit(step, state, *args, reps, inner):
  """Median seconds of one `state, out = step(state, *args)`.

  `inner` steps run inside one jitted fori_loop (host dispatch amortised);
  an optimization_barrier ties each step's inputs to the previous output so
  XLA can't hoist the loop-invariant call. Returns (seconds, last output).
  """
  out_shape = jax.eval_shape(step, state, *args)[1]

  def many(state, args):
    out = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out_shape)

    def body(_, carry):
      state, args, out = lax.optimization_barrier(carry)
      state, out = step(state, *args)
      return state, args, out

    state, _, out = lax.fori_loop(0, inner, body, (state, args, out))
    return state, out

  many = jax.jit(many, donate_argnums=0)
  state, out = jax.block_until_ready(many(state, args))  # compile + warm up
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    state, out = jax.block_until_ready(many(state, args))
    times.append((time.perf_counter() - t0) / inner)
  return statistics.median(times), out


def stateless(f):
  return jax.jit(lambda state, *a: (state, f(*a)))


def copy_bandwidth(nbytes, reps, inner):
  """Bytes/s of x + 1 over a bf16 buffer (reads and writes nbytes each)."""
  x = jnp.zeros((nbytes // 2,), jnp.bfloat16)
  t, _ = timeit(lambda x: (x + 1, None), x, reps=reps, inner=inner)
  return 2 * nbytes / t


def max_err(a, b):
  leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
  return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(
      jnp.float32)))) for x, y in leaves)


SHORT = {"block_r": "r", "block_k": "k", "split_tiles": "st", "num_warps": "w",
         "block_m": "m", "block_n": "n", "block_e": "e", "split_e": "sp"}


def attention_flops(b, q, h, s, t, d, mass):
  """QK^T and PV over S cache + T in-query keys (2 FLOPs per MAC); the mass
  pass re-streams K and recomputes QK^T over the S cache keys (the kernel
  does so both fused and as a separate call). exp/softmax not counted."""
  return 4 * b * q * h * (s + t) * d + (2 * b * q * h * s * d if mass else 0)


def matmul_flops(m, e, n, swiglu):
  return 2 * m * e * n * (2 if swiglu else 1)


def roofline(nbytes, flops, seconds, copy_bw, mm_rate):
  t_mem, t_flop = nbytes / copy_bw, flops / mm_rate
  t = max(t_mem, t_flop)
  return dict(flops=flops, tflop_s=flops / seconds / 1e12,
              roofline_us=t * 1e6, frac_roofline=t / seconds,
              bound="mem" if t_mem >= t_flop else "flop")


def _grid(default, axes, limit, seed, resolve):
  """Distinct resolved configs: default, one axis changed at a time, then
  random combinations; at most `limit`. resolve(cfg) -> concrete or None."""
  out, seen = [], set()

  def add(cfg):
    cfg = resolve(dict(cfg))
    key = cfg and tuple(sorted(cfg.items()))
    if cfg and key not in seen:
      seen.add(key)
      out.append(cfg)

  add(default)
  for k, vals in axes.items():
    for v in vals:
      add({**default, k: v})
  combos = [dict(zip(axes, vs)) for vs in itertools.product(*axes.values())]
  random.Random(seed).shuffle(combos)
  for c in combos:
    add({**default, **c})
  return out[:limit]


def _splits(sym, default, cap):
  """split_e as 'd' (kernel default), '2d', '4d' or an int."""
  n = {"d": default, "2d": 2 * default, "4d": 4 * default}.get(sym, sym)
  return max(1, min(n, cap))


def attention_configs(b, q, h, kh, s, d, limit=16, seed=0):
  """Tilings of kernel.scheduled_attention for one shape; [0] = default
  (block_r from the row count, block_k 64, default_split_tiles, 4 warps up
  to block_r 64 else 8: mirrors the kernel's own defaults, which depend on
  neither the batch nor head_dim). split_tiles 'd' is the default, 'one'
  a single split; an int at least the tile count is one split too."""
  del b, d
  rr = q * (h // kh)
  r_max = max(16, next_pow2(rr))

  def resolve(c):
    if c["block_r"] > r_max:  # tiles of padding only
      return None
    n_rt = -(-rr // c["block_r"])
    n_tiles = -(-s // c["block_k"])
    dflt = attn_tiling.default_split_tiles(kh, n_rt, s, c["block_k"])
    st = {"d": dflt, "one": n_tiles}.get(c["split_tiles"], c["split_tiles"])
    return dict(block_r=c["block_r"], block_k=c["block_k"],
                split_tiles=min(st, n_tiles),
                num_warps=c["num_warps"] or (4 if c["block_r"] <= 64 else 8))

  default = dict(block_r=min(64, r_max), block_k=64, split_tiles="d",
                 num_warps=None)
  axes = dict(block_r=[16, 32, 64, 128], block_k=[16, 32, 64],
              split_tiles=["d", "one", 2, 4, 8], num_warps=[4, 8])
  return _grid(default, axes, limit, seed, resolve)


def matmul_configs(m, e, n, swiglu, limit=16, seed=0):
  """Tilings of kernel.matmul for one shape; [0] = default (block_m from M,
  block_n 64, block_e 128, default_split, 4 warps)."""
  del swiglu
  m_max = max(16, next_pow2(m))

  def resolve(c):
    if c["block_m"] > m_max:
      return None
    dflt = mm_kernel.default_split(m, n, e, c["block_m"], c["block_n"],
                                   c["block_e"])
    return dict(block_m=c["block_m"], block_n=c["block_n"],
                block_e=c["block_e"],
                split_e=_splits(c["split_e"], dflt, -(-e // c["block_e"])),
                num_warps=c["num_warps"])

  default = dict(block_m=min(64, m_max), block_n=64, block_e=128,
                 split_e="d", num_warps=4)
  axes = dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128],
              block_e=[64, 128, 256], split_e=["d", 1, "2d", "4d"],
              num_warps=[4, 8])
  return _grid(default, axes, limit, seed, resolve)


def seed_of(label):
  return zlib.crc32(label.encode())


def fmt(cfg):
  return " ".join(f"{SHORT.get(k, k)}{v}" for k, v in cfg.items()
                  if k in SHORT)


def tune(label, configs, time_cfg, err_fn, default_us, default_err, xla_us):
  """Times configs[1:] (configs[0], the default, was timed as the row).

  time_cfg(cfg) -> (seconds, output); err_fn(output) -> max error against
  the XLA baseline. A config that raises (NotImplementedError, a lowering
  or compile failure) is kept in "all" with its error; "best" is the
  fastest whose error stays within 4x the default's + 0.01.
  """
  entries = [dict(configs[0], us=default_us, max_err=default_err)]
  print(f"  tune {label} [{fmt(configs[0])}] {default_us:.1f} us (default)",
        flush=True)
  for cfg in configs[1:]:
    try:
      t, out = time_cfg(cfg)
      entry = dict(cfg, us=t * 1e6, max_err=err_fn(out))
      msg = f"{entry['us']:.1f} us, err {entry['max_err']:.3g}"
    except Exception as e:  # noqa: BLE001  unsupported or failed to compile
      entry = dict(cfg, error=f"{type(e).__name__}: {e}"[:200])
      msg = entry["error"][:100]
    print(f"  tune {label} [{fmt(cfg)}] {msg}", flush=True)
    entries.append(entry)
  ok = [x for x in entries
        if "us" in x and x["max_err"] <= 4 * default_err + 0.01]
  best = min(ok, key=lambda x: x["us"]) if ok else entries[0]
  return dict(default=entries[0], best=best, xla_us=xla_us,
              gain=default_us / best["us"], all=entries)


def tuning_table(tuning):
  out = ["| op | shape | default | us | best | us | gain | xla us |",
         "|---|---|---|---|---|---|---|---|"]
  for op, shapes in tuning.items():
    for shape, t in shapes.items():
      out.append(
          f"| {op} | {shape} | {fmt(t['default'])} | {t['default']['us']:.3g}"
          f" | {fmt(t['best'])} | {t['best']['us']:.3g} | {t['gain']:.2f} | "
          f"{t['xla_us']:.3g} |")
  return "\n".join(out)
