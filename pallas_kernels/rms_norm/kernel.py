"""Pallas (Triton) RMSNorm whose bits depend on the row alone.

Grid: one program per `block_n` rows; each loads its rows whole (E padded to
a power of two, masked) and sums the squares in one tile. The tile shape and
warp count depend on E only, never on N or on what surrounds the call, so a
row's sum runs the same adds in every batch, fusion and mesh: XLA's own
reduction order followed the fusion it landed in, which differed between one
device and a tensor-parallel mesh.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.common import next_pow2

MAX_E = 16384  # one tile per row: larger rows would spill registers


def tiles(e: int) -> tuple[int, int, int]:
  """(block_n, block_e, num_warps) for rows of width e: ~8k elements a tile."""
  block_e = next_pow2(e)
  return (max(1, min(16, 8192 // block_e)), block_e,
          8 if block_e >= 2048 else 4)


def _kernel(x_ref, scale_ref, out_ref, *, n, e, eps, block_n, block_e):
  first = pl.program_id(0) * block_n
  rows = pl.ds(first, block_n)
  cols = pl.ds(0, block_e)
  col_ok = jnp.arange(block_e) < e
  ok = (first + jnp.arange(block_n) < n)[:, None] & col_ok[None, :]
  x = plgpu.load(x_ref.at[rows, cols], mask=ok, other=0)
  x32 = x.astype(jnp.float32)
  mean_sq = jnp.sum(x32 * x32, axis=1) / e  # padding adds exact zeros
  y = (x32 * lax.rsqrt(mean_sq + eps)[:, None]).astype(x.dtype)
  scale = plgpu.load(scale_ref.at[cols], mask=col_ok, other=0)
  plgpu.store(out_ref.at[rows, cols], y * scale.astype(x.dtype), mask=ok)


@functools.partial(jax.jit, static_argnames=("eps", "interpret"))
def rms_norm(x_NxE: jax.Array, scale_E: jax.Array, *, eps: float,
             interpret: bool = False) -> jax.Array:
  """Same contract as reference.rms_norm; differs from it by rounding only
  (the sum of squares in another order)."""
  n, e = x_NxE.shape
  if scale_E.shape != (e,):
    raise ValueError(f"scale {scale_E.shape} must be [E] = ({e},)")
  if e > MAX_E:
    raise NotImplementedError(f"rows of {e} > {MAX_E} elements")
  block_n, block_e, num_warps = tiles(e)
  kern = functools.partial(_kernel, n=n, e=e, eps=eps, block_n=block_n,
                           block_e=block_e)
  return pl.pallas_call(
      kern, grid=(pl.cdiv(n, block_n),),
      out_shape=jax.ShapeDtypeStruct((n, e), x_NxE.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret)(x_NxE, scale_E)
