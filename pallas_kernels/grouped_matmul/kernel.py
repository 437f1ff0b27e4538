"""Pallas (Triton) grouped GEMM: one program per (row tile, column tile).

Rows come sorted by expert and padded so that every tile of tile_m rows
belongs to one expert (tile_expert, -1 = empty). A program loads its
tile's expert from tile_expert, skips an empty tile (writing zeros), and
otherwise sums its [tile_m, block_n] output over the inputs in blocks of
block_k, in order, from float32 accumulators (two, gate and up, for the
fused SwiGLU: one read of x for both). 8-bit weights (kernel_q [X, O, I],
scale [X, O, Z]) are converted to x's dtype in registers (exact for int8
and e4m3 in bf16); a per-channel scale multiplies the float32 sum once, a
per-group one (the group = block_k) each block's product. A kernel_q in
x's own dtype with scales of one is the [X, O, I] layout of a plain
weight (DiffusionGemma's stored experts), the same sums exactly.

Column tiles run fastest: the programs in flight at once share their row
tiles and, the rows being sorted, their experts' weights (L2).

Row invariance: every tile shape depends on I, O and the options, never
on P, and each output element is one dot over its row and its expert's
column in a fixed block order, so a row's bits do not depend on the rows
beside it.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.common import is_pow2
from pallas_kernels.split_e import silu

WEIGHT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))


def _kernel(te_ref, x_ref, *refs, tm, bn, bk, n_k, quantized, grouped,
            swiglu, precision):
  per = 2 if quantized else 1
  weights = [refs[i * per:(i + 1) * per] for i in range(1 + swiglu)]
  o_ref = refs[-1]
  j, i = pl.program_id(0), pl.program_id(1)
  rows, cols = pl.ds(i * tm, tm), pl.ds(j * bn, bn)
  ex = te_ref[i]

  @pl.when(ex < 0)
  def _empty():
    o_ref[rows, cols] = jnp.zeros((tm, bn), o_ref.dtype)

  @pl.when(ex >= 0)
  def _tile():
    def body(t, accs):
      ks = pl.ds(t * bk, bk)
      x = x_ref[rows, ks]
      out = []
      for acc, w in zip(accs, weights):
        if quantized:
          wt = w[0][ex, cols, ks].astype(x.dtype)
          d = lax.dot_general(x, wt, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32,
                              precision=precision)
          if grouped:
            d = d * w[1][ex, cols, t][None, :]
        else:
          wt = w[0][ex, ks, cols].astype(x.dtype)
          d = lax.dot_general(x, wt, (((1,), (0,)), ((), ())),
                              preferred_element_type=jnp.float32,
                              precision=precision)
        out.append(acc + d)
      return tuple(out)

    zeros = jnp.zeros((tm, bn), jnp.float32)
    accs = lax.fori_loop(0, n_k, body, (zeros,) * (1 + swiglu))
    if quantized and not grouped:
      # (an int32 0: a Python 0 index does not discharge in interpret mode)
      accs = tuple(acc * w[1][ex, cols, jnp.int32(0)][None, :]
                   for acc, w in zip(accs, weights))
    y = silu(accs[0]) * accs[1] if swiglu else accs[0]
    o_ref[rows, cols] = y.astype(o_ref.dtype)


def _block(n: int, want: int) -> int:
  """The largest power of two <= want dividing n (>= 16, else raises)."""
  b = want
  while b >= 16 and n % b:
    b //= 2
  if b < 16 or not is_pow2(b):
    raise NotImplementedError(f"width {n} has no power-of-two tile >= 16 "
                              f"dividing it")
  return b


@functools.partial(jax.jit, static_argnames=(
    "tile_m", "block_n", "block_k", "num_warps", "num_stages", "interpret"))
def grouped_matmul(x_PxI, tile_expert, weight, *, up=None, tile_m: int = 64,
                   block_n: int = 128, block_k: int = 64, num_warps: int = 4,
                   num_stages: int = 3, interpret: bool = False):
  """Same contract as reference.grouped_matmul. Block sizes shrink to the
  largest power of two dividing the widths. Raises NotImplementedError for
  a tile_m that is not a power of two >= 16, widths without such a tile,
  8-bit weights neither int8 nor e4m3, per-group scales in groups that
  are not such a tile, or arrays of 2^31 elements or more."""
  p, i = x_PxI.shape
  quantized = len(weight) == 2
  o = weight[0].shape[1] if quantized else weight[0].shape[2]
  if not (is_pow2(tile_m) and tile_m >= 16) or p % tile_m:
    raise NotImplementedError(f"tile_m {tile_m} (a power of two >= 16 "
                              f"dividing P = {p})")
  bn, bk = _block(o, block_n), _block(i, block_k)
  if quantized and weight[0].dtype not in WEIGHT_DTYPES + (
      jnp.dtype(x_PxI.dtype),):
    raise NotImplementedError(f"8-bit weights of dtype {weight[0].dtype}")
  grouped = quantized and weight[1].shape[-1] > 1
  if grouped:
    group = i // weight[1].shape[-1]
    if group < 16 or not is_pow2(group):
      raise NotImplementedError(f"scale groups of {group} inputs")
    bk = group
  compute = jnp.dtype(x_PxI.dtype)
  if compute not in (jnp.bfloat16, jnp.float32):
    raise NotImplementedError(f"x dtype {compute}: bfloat16 or float32")
  precision = lax.Precision.HIGHEST if compute == jnp.float32 else None
  args = [tile_expert.astype(jnp.int32), x_PxI]
  for w in (weight,) + ((up,) if up is not None else ()):
    args += [w[0], w[1].astype(jnp.float32)] if quantized else [w[0]]
  if max(p * o, *(a.size for a in args)) >= 2 ** 31:
    raise NotImplementedError("arrays of 2^31 elements or more (the "
                              "kernel's offsets are int32)")
  kernel = functools.partial(
      _kernel, tm=tile_m, bn=bn, bk=bk, n_k=i // bk, quantized=quantized,
      grouped=grouped, swiglu=up is not None, precision=precision)
  whole = lambda a: pl.BlockSpec(a.shape, lambda r, c: (0,) * a.ndim)
  return pl.pallas_call(
      kernel, grid=(o // bn, p // tile_m),
      in_specs=[whole(a) for a in args],
      out_specs=pl.BlockSpec((p, o), lambda r, c: (0, 0)),
      out_shape=jax.ShapeDtypeStruct((p, o), x_PxI.dtype),
      interpret=interpret, name="grouped_matmul",
      compiler_params=plgpu.CompilerParams(
          num_warps=num_warps, num_stages=num_stages))(*args)
