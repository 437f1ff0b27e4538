"""Merge of the scheduled attention kernel's key splits: a small kernel, so
every row is merged by the same code whatever the batch size."""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _combine_kernel(o_ref, lse_ref, out_ref, out_lse_ref, *, splits):
  """Log-sum-exp merge of the key splits of one row tile: the largest lse
  m, then acc = sum_j o_j * exp(lse_j - m) and total = sum_j exp(lse_j - m)
  in split order, each as a loop of one body.

  A kernel rather than XLA ops so that every row is merged by the same code
  whatever the batch size: XLA compiles its own combine per array shape,
  and on CPU that changed low bits with the batch (a row's result would
  then depend on the other rows). A loop rather than unrolled steps so that
  the rounding of each step (a fused multiply-add or not) does not depend
  on the split count. Leading splits of pad keys only (o = 0, lse = NEG:
  left padding) add exact zeros, so a row's result does not depend on them;
  one split with keys gives acc = o, total = 1: the unmerged output."""
  r = lse_ref.shape[1]
  m = lax.fori_loop(1, splits, lambda j, m: jnp.maximum(m, lse_ref[j, :]),
                    lse_ref[0, :])

  def add(j, carry):
    acc, total = carry
    w = jnp.exp(lse_ref[j, :] - m)
    return acc + o_ref[j, :, :] * w[:, None], total + w

  acc, total = lax.fori_loop(
      0, splits, add, (jnp.zeros(o_ref.shape[1:], jnp.float32),
                       jnp.zeros((r,), jnp.float32)))
  out_ref[...] = (acc / total[:, None]).astype(out_ref.dtype)
  out_lse_ref[...] = m + jnp.log(total)


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
