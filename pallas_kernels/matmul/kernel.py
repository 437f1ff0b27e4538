"""Pallas (Triton) weight-streaming matmul for small M (decode projections).

With M <= 256 tokens a projection is bound by reading W once, so the kernel is
organised around W: grid (row tile, column tile, E split) with row tiles
fastest, so programs sharing a W tile run together (one HBM read, L2 hits).
When the column tiles alone can't fill the GPU (k/v projections, batch 1), the
contraction is split across programs (split-E); partial sums are float32 and
XLA adds them and applies the epilogue. Otherwise the epilogue (SwiGLU
silu(g) * u with both weights streamed in one loop, residual add) is fused.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import split_e as se
from pallas_kernels.common import is_pow2, next_pow2


def _kernel(*refs, m, n, e, bm, bn, be, splits, swiglu, residual, final):
  x_ref, w_ref = refs[:2]
  wu_ref = refs[2] if swiglu else None
  res_ref = refs[2 + swiglu] if residual else None
  out_refs = refs[2 + swiglu + residual:]
  i, j, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  rows, cols = pl.ds(i * bm, bm), pl.ds(j * bn, bn)
  row_ok = i * bm + jnp.arange(bm) < m
  col_ok = j * bn + jnp.arange(bn) < n
  e0, e1 = se.block_range(e, be, splits, sp)

  def body(t, accs):
    ek = pl.ds(t * be, be)
    e_ok = t * be + jnp.arange(be) < e
    x = plgpu.load(x_ref.at[rows, ek], mask=row_ok[:, None] & e_ok[None, :],
                   other=0)
    w_mask = e_ok[:, None] & col_ok[None, :]
    out = []
    for acc, ref in zip(accs, (w_ref, wu_ref)):
      w = plgpu.load(ref.at[ek, cols], mask=w_mask, other=0).astype(x.dtype)
      out.append(acc + lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32))
    return tuple(out)

  zeros = jnp.zeros((bm, bn), jnp.float32)
  accs = lax.fori_loop(e0, e1, body, (zeros, zeros) if swiglu else (zeros,))
  se.store_tile(accs, out_refs, res_ref, rows, cols,
                row_ok[:, None] & col_ok[None, :], swiglu=swiglu, final=final)


def default_split(m, n, e, block_m, block_n, block_e, target=264):
  """Splits of E so that about `target` programs run (2 per H200 SM)."""
  programs = pl.cdiv(m, block_m) * pl.cdiv(n, block_n)
  return max(1, min(pl.cdiv(target, programs), pl.cdiv(e, block_e) // 4))


@functools.partial(jax.jit, static_argnames=(
    "block_m", "block_n", "block_e", "split_e", "num_warps", "num_stages",
    "interpret"))
def matmul(x_MxE, w_ExO, *, w_up_ExO=None, residual_MxO=None,
           block_m: int | None = None, block_n: int = 64, block_e: int = 128,
           split_e: int | None = None, num_warps: int = 4,
           num_stages: int | None = None, interpret: bool = False):
  """Same contract as reference.matmul. split_e None picks default_split;
  num_stages None picks the deepest pipeline (<= 4) whose tiles fit in
  ~180 KiB of shared memory.

  Raises NotImplementedError for M > 256 or non power-of-two tiles.
  """
  m, e = x_MxE.shape
  n = w_ExO.shape[1]
  if m > 256 or w_ExO.shape[0] != e:
    raise NotImplementedError(f"x {x_MxE.shape} @ w {w_ExO.shape}: M <= 256")
  bm = block_m or min(64, max(16, next_pow2(m)))
  if not all(is_pow2(t) and t >= 16 for t in (bm, block_n, block_e)):
    raise NotImplementedError("tiles must be powers of two >= 16")
  splits = split_e or default_split(m, n, e, bm, block_n, block_e)
  if num_stages is None:
    per_stage = (bm * block_e + block_e * block_n * (
        1 + (w_up_ExO is not None))) * x_MxE.dtype.itemsize
    num_stages = se.pipeline_depth(per_stage)
  swiglu, residual = w_up_ExO is not None, residual_MxO is not None
  final = splits == 1
  args = [x_MxE, w_ExO] + ([w_up_ExO] if swiglu else [])
  if residual and final:
    args.append(residual_MxO)
  kernel = functools.partial(
      _kernel, m=m, n=n, e=e, bm=bm, bn=block_n, be=block_e, splits=splits,
      swiglu=swiglu, residual=residual and final, final=final)
  outs = se.launch(
      kernel, args, (pl.cdiv(m, bm), pl.cdiv(n, block_n), splits),
      se.outputs(m, n, splits, 1 + swiglu, x_MxE.dtype),
      name="stream_matmul", interpret=interpret, num_warps=num_warps,
      num_stages=num_stages)
  if final:
    return outs[0]
  y = jnp.sum(outs[0], axis=0)
  if swiglu:
    y = jax.nn.silu(y) * jnp.sum(outs[1], axis=0)
  if residual:
    y = y + residual_MxO.astype(jnp.float32)
  return y.astype(x_MxE.dtype)
