"""Merge of the scheduled attention kernel's key splits: a small kernel, so
every row is merged by the same code whatever the batch size."""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG = -1e30  # the attention kernels' finite "minus infinity": exp(NEG - NEG) = 1


def merge_start(r, d):
  """The empty merge state (m [R], acc [R, D], total [R]) in float32."""
  return (jnp.full((r,), NEG, jnp.float32), jnp.zeros((r, d), jnp.float32),
          jnp.zeros((r,), jnp.float32))


def merge_step(carry, o_RxD, lse_R):
  """One key split's partial (o normalised, lse) into the running merge:
  an online log-sum-exp, m the largest lse so far, acc and total rescaled
  to it. The one body both merges run (this kernel's loop over partials
  and the attention kernel's loop over the splits it holds), so a row's
  bits do not depend on which of them merged it.

  Leading splits of pad keys only (o = 0, lse = NEG: left padding) leave
  acc = 0 and a total that the first split with keys scales by
  exp(NEG - lse) = 0, so a row's result does not depend on them."""
  m, acc, total = carry
  m_new = jnp.maximum(m, lse_R)
  a, w = jnp.exp(m - m_new), jnp.exp(lse_R - m_new)
  return m_new, acc * a[:, None] + o_RxD * w[:, None], total * a + w


def merge_end(carry):
  """(o [R, D] float32, lse [R]) of a merge: one split with keys gives
  acc = o, total = 1, the unmerged output."""
  m, acc, total = carry
  return acc / total[:, None], m + jnp.log(total)


def _combine_kernel(o_ref, lse_ref, out_ref, out_lse_ref, *, splits):
  """merge_step over the key splits of one row tile, in split order.

  A kernel rather than XLA ops so that every row is merged by the same code
  whatever the batch size: XLA compiles its own combine per array shape,
  and on CPU that changed low bits with the batch (a row's result would
  then depend on the other rows). A loop rather than unrolled steps so that
  the rounding of each step (a fused multiply-add or not) does not depend
  on the split count."""
  r, d = o_ref.shape[1:]
  o, lse = merge_end(lax.fori_loop(
      0, splits, lambda j, c: merge_step(c, o_ref[j, :, :], lse_ref[j, :]),
      merge_start(r, d)))
  out_ref[...] = o.astype(out_ref.dtype)
  out_lse_ref[...] = lse


def merge_splits(o_splitxBxKxQJxD, lse_splitxBxKxQJ, *, block_r: int, out_dtype,
                 interpret: bool):
  """(o_BxKxQJxD, lse_BxKxQJ) from the partial outputs and log-sum-exps of P
  key splits (QJ rows per (sequence, kv head) in tiles of block_r)."""
  splits, b, kh, rrp, d = o_splitxBxKxQJxD.shape
  bk = lambda z: (z // kh, z % kh)
  return pl.pallas_call(
      functools.partial(_combine_kernel, splits=splits),
      grid=(rrp // block_r, b * kh), interpret=interpret,
      # Triton explicitly: without compiler params a jax whose
      # jax_pallas_use_mosaic_gpu defaults to True (0.10) lowers through
      # Mosaic GPU, which refuses these 64-row tiles.
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
      in_specs=[pl.BlockSpec((splits, None, None, block_r, d),
                             lambda i, z: (0, *bk(z), i, 0)),
                pl.BlockSpec((splits, None, None, block_r),
                             lambda i, z: (0, *bk(z), i))],
      out_specs=[pl.BlockSpec((None, None, block_r, d),
                              lambda i, z: (*bk(z), i, 0)),
                 pl.BlockSpec((None, None, block_r),
                              lambda i, z: (*bk(z), i))],
      out_shape=[jax.ShapeDtypeStruct((b, kh, rrp, d), out_dtype),
                 jax.ShapeDtypeStruct((b, kh, rrp), jnp.float32)],
      name="scheduled_attention_combine")(o_splitxBxKxQJxD, lse_splitxBxKxQJ)
