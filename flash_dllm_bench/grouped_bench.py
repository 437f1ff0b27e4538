"""The routed experts' grouped GEMMs alone (scripts/bench_moe.py --gemm).

At an MoE config's expert shapes and a token count, random top-k routing
(K distinct experts a token, uniform): the pairs sorted and padded
(layout.sort_pairs, outside the timing), then gate/up with the fused
SwiGLU and down, by each of VARIANTS: the Triton kernel at a given tiling
and Mosaic GPU's at its own row tile (mosaic.rows_per_tile), with and
without the wgmma overlap. bf16 or 8-bit (int8, e4m3, per-channel scales)
stacks. Each row: median ms, the floor (the stacks of the experts the
pairs route to, read at the copy rate, or the pairs' FLOPs at the bf16
matmul rate, the larger; both rates measured in the caller's run) and the
first variant's ms over this one's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_bench import timing
from pallas_kernels.grouped_matmul import api, layout, mosaic
from pallas_kernels.qmatmul.reference import FP8

# (name, implementation, options): Triton first, the ratio's base.
VARIANTS = (("triton", "pallas", {}), ("mosaic", "mosaic", {}),
            ("mosaic overlap", "mosaic", dict(overlap=True)))
FORMATS = {"bf16": None, "int8": jnp.int8, "fp8": FP8}


def stacks(n_experts: int, e: int, m: int, fmt: str, seed: int = 0):
  """(gate, up, down) of random weights in format fmt; 8-bit values are
  random codes (timing only), scales ~ 1 / (127 sqrt(fan_in))."""
  keys = jax.random.split(jax.random.key(seed), 6)

  def one(k, ks, n_in, n_out):
    if fmt == "bf16":
      return (jax.random.normal(k, (n_experts, n_in, n_out), jnp.bfloat16)
              * n_in ** -0.5,)
    q = jax.random.randint(k, (n_experts, n_out, n_in), -127, 128, jnp.int8)
    s = jax.random.uniform(ks, (n_experts, n_out, 1), jnp.float32, 0.5, 1.5)
    return q.astype(FORMATS[fmt]), s * (n_in ** -0.5 / 127)

  return (one(keys[0], keys[1], e, m), one(keys[2], keys[3], e, m),
          one(keys[4], keys[5], m, e))


def routed(tokens: int, e: int, n_experts: int, k: int, seed: int = 1):
  """(x [T, E] bf16, expert ids [T, K]): K distinct experts a token."""
  kx, ki = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (tokens, e), jnp.bfloat16)
  scores = jax.random.uniform(ki, (tokens, n_experts))
  return x, jax.lax.top_k(scores, k)[1].astype(jnp.int32)


def gemm_ms(x, ids, weights, impl, tile_m, reps, **options) -> float:
  """Median ms of gate/up (SwiGLU) then down over the sorted pairs."""
  n_experts = weights[0][0].shape[0]
  dest, tiles = layout.sort_pairs(ids.reshape(-1), n_experts, tile_m)
  rows = layout.gather_rows(x, dest, ids.shape[1], tiles.shape[0] * tile_m)
  run = lambda a, w, u=None: api.grouped_matmul(
      a, tiles, w, up=u, tile_m=tile_m, implementation=impl, **options)
  f = jax.jit(lambda rows, g, u, d: run(run(rows, g, u), d))
  jax.block_until_ready(f(rows, *weights))  # compiled and warm
  return timing.time_fn(lambda: f(rows, *weights), reps=reps,
                        warmup=0) * 1e3


def rows(moe, d_model: int, tokens: int, fmt: str, bw: float, mm: float,
         reps: int, triton_tiling, interpret: bool,
         variants=VARIANTS) -> list[dict]:
  """One row per variant (an exception becomes the row's error)."""
  x, ids = routed(tokens, d_model, moe.n_experts, moe.top_k)
  weights = stacks(moe.n_experts, d_model, moe.hidden, fmt)
  touched = np.unique(np.asarray(ids)).size / moe.n_experts
  nbytes = touched * sum(a.nbytes for w in weights for a in w)
  flops = 2 * tokens * moe.top_k * 3 * d_model * moe.hidden
  floor_ms = max(nbytes / bw, flops / mm) * 1e3
  out = []
  for name, impl, options in variants:
    if impl == "pallas":
      tile_m, options = triton_tiling.tile_m, triton_tiling.kernel_args()
    else:
      tile_m = mosaic.rows_per_tile(ids.size, moe.n_experts)
    impl = impl + "_interpret" if interpret else impl
    row = dict(kind=f"grouped gemm {name} {fmt}", tokens=tokens,
               tile_m=tile_m, floor_ms=floor_ms)
    try:
      row["ms"] = gemm_ms(x, ids, weights, impl, tile_m, reps, **options)
      row["peak_gb"] = (timing.peak_memory_bytes() or 0) / 1e9
      if out and "ms" in out[0]:
        row["triton_over_this"] = out[0]["ms"] / row["ms"]
    except Exception as e:  # noqa: BLE001 (a failed variant still reports)
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out.append(row)
    print(row, flush=True)
  return out
