"""The scheduled attention kernels' operands and their blocks: per-query
values folded over the J heads of a kv head (and the output unfolded), the
BlockSpecs of grid (row tile i, key split group j, sequence * kv head z),
and the fixed-order sum of the row tiles' mass partials."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.attention.reference import tree_sum


def fold_rows(x_BxQx, g, rrp):
  """Repeats per-query values over the J folded heads, pads rows to rrp."""
  x = jnp.repeat(x_BxQx, g, axis=1)
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, rrp - x.shape[1])
  return jnp.pad(x, pad)


def fold_queries(q_BxQxHxD, kh, rrp):
  """q_BxKxQJxD: the J = H / K heads of each kv head folded into the rows
  (query-major), rows padded to rrp."""
  b, q, h, d = q_BxQxHxD.shape
  q_BxKxQJxD = q_BxQxHxD.reshape(b, q, kh, h // kh, d).transpose(0, 2, 1, 3, 4)
  return jnp.pad(q_BxKxQJxD.reshape(b, kh, q * h // kh, d),
                 ((0, 0), (0, 0), (0, rrp - q * h // kh), (0, 0)))


def unfold_output(o_BxKxRxD, q, g):
  """o_BxQxHxD from the folded rows (fold_queries' inverse, padding cut)."""
  b, kh, _, d = o_BxKxRxD.shape
  return o_BxKxRxD[:, :, :q * g].reshape(b, kh, q, g, d).transpose(
      0, 2, 1, 3, 4).reshape(b, q, kh * g, d)


def sum_mass_tiles(mass_BxKxTxS, has_score_BxT, k_len_B):
  """mass_BxKxS: the row tiles' mass partials summed by reference.tree_sum,
  counting only those written (tiles holding a score row, slots < k_len)."""
  s = mass_BxKxTxS.shape[-1]
  written = (has_score_BxT[:, None, :, None]
             & (jnp.arange(s) < k_len_B[:, None])[:, None, None, :])
  return tree_sum(jnp.where(written, mass_BxKxTxS, 0.0), axis=2)


def inputs(rows, kh, k_len_B, q_BxKxQJxD, k_cache_BxSxKxD, v_cache_BxSxKxD,
           info_BxQJ, exclude_BxS=None, new=None, scales=None, kv_repeat=1):
  """(in_specs, args) for programs of `rows` rows: k_len, the folded
  queries, the whole cache of one (sequence, kv head), the per-row info
  bytes, an 8-bit cache's `scales` = (k_scale_BxSxK, v_scale_BxSxK) if
  any, the int8 exclusions if any, and `new` = (k_new_BxIxKxD,
  v_new_BxIxKxD, inq_BxQJxI) if any. kv_repeat: consecutive query
  sequences sharing one cache row (its K/V, scales and exclusions)."""
  s, _, d = k_cache_BxSxKxD.shape[1:]
  bk = lambda z: (z // kh, z % kh)
  kv = lambda z: z // kh // kv_repeat
  cache_blk = pl.BlockSpec((None, s, None, d),
                           lambda i, j, z: (kv(z), 0, z % kh, 0))
  in_specs = [pl.BlockSpec((None,), lambda i, j, z: (z // kh,)),
              pl.BlockSpec((None, None, rows, d),
                           lambda i, j, z: (*bk(z), i, 0)),
              cache_blk, cache_blk,
              pl.BlockSpec((None, rows), lambda i, j, z: (z // kh, i))]
  args = [k_len_B.astype(jnp.int32), q_BxKxQJxD, k_cache_BxSxKxD,
          v_cache_BxSxKxD, info_BxQJ]
  if scales is not None:
    scale_blk = pl.BlockSpec((None, s, None),
                             lambda i, j, z: (kv(z), 0, z % kh))
    in_specs += [scale_blk, scale_blk]
    args += list(scales)
  if exclude_BxS is not None:
    in_specs.append(pl.BlockSpec((None, s), lambda i, j, z: (kv(z), 0)))
    args.append(exclude_BxS.astype(jnp.int8))
  if new is not None:
    t_new = new[0].shape[1]
    new_blk = pl.BlockSpec((None, t_new, None, d),
                           lambda i, j, z: (z // kh, 0, z % kh, 0))
    in_specs += [new_blk, new_blk, pl.BlockSpec(
        (None, rows, t_new), lambda i, j, z: (z // kh, i, 0))]
    args += list(new)
  return in_specs, args


def outputs(splits, b, kh, rrp, block_r, d, o_dtype):
  """(out_specs, out_shape) of the partial outputs o [P, B, K, QJ, D] and
  log-sum-exps [P, B, K, QJ] of P key splits. A program's blocks hold all
  P splits of its row tile: it writes those of its split group."""
  bk = lambda z: (z // kh, z % kh)
  out_specs = [
      pl.BlockSpec((splits, None, None, block_r, d),
                   lambda i, j, z: (0, *bk(z), i, 0)),
      pl.BlockSpec((splits, None, None, block_r),
                   lambda i, j, z: (0, *bk(z), i))]
  out_shape = [jax.ShapeDtypeStruct((splits, b, kh, rrp, d), o_dtype),
               jax.ShapeDtypeStruct((splits, b, kh, rrp), jnp.float32)]
  return out_specs, out_shape


def mass_output(b, kh, n_mt, s):
  """(out_spec, out_shape) of the float32 mass partials [B, K, n_mt, S]:
  one row of S per (sequence, kv head, mass row tile), shared by the
  programs of every split group, which write disjoint key tiles."""
  return (pl.BlockSpec((None, None, None, s),
                       lambda i, j, z: (z // kh, z % kh, i, 0)),
          jax.ShapeDtypeStruct((b, kh, n_mt, s), jnp.float32))
