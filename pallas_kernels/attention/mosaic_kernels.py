"""The bodies of the Mosaic GPU scheduled attention (mosaic.py): the
attention over the key splits of a 64-row tile and the per-key mass.

One warpgroup a program (Lane semantics: values carry wgmma's register
layouts). A program owns ROWS = 64 folded rows (wgmma's M) of one
(sequence, kv head) and, for each key split of its group, streams the
split's 64-key tiles through shared memory with TMA (plgpu.emit_pipeline
over a grid of the split's tile count, which is traced), from a fresh
online-softmax state into the split's own partial (o, lse).

Keys: one float32 per slot, 1 = valid (slot < k_len, not excluded), comes
through the pipeline with its K/V tile; excluded and dead slots may hold
NaN (TMA copies whole tiles), so their scores are replaced (where, never
an additive bias) and, in a tile that has any (a per-tile flag), their V
rows are zeroed in shared memory before the P.V wgmma (0 * NaN is NaN).

`Ops` holds what differs in Mosaic GPU's interpret mode (jax 0.10), which
runs no transposed wgmma operand, no register A operand and no layout cast
on the CPU: there the two products are lax.dot_general of the loaded tiles
(the same bf16 x bf16 -> float32 products, another summation order) and
layout casts are dropped; everything else (TMA pipeline, index maps, split
ranges, masks, the softmax) is the code the GPU runs.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.attention.combine import NEG
from pallas_kernels.attention.tiling import split_range

ROWS = 64      # rows a program owns: wgmma's M, one warpgroup
BLOCK_K = 64   # keys a tile: tiling.PAD_ALIGN
F32 = jnp.float32
WGMMA = plgpu.Layout.WGMMA


def swizzled(dtype, minor: int):
  """Tiling + swizzle transforms of a shared-memory tile whose last dim has
  `minor` elements (wgmma operands and TMA destinations)."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)),
          plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class Ops:
  """The operations that Mosaic GPU's interpret mode runs otherwise."""
  interpret: bool

  def cast(self, x, layout):
    return x if self.interpret else plgpu.layout_cast(x, layout)

  def load(self, ref, layout):
    """ref[...] in `layout` (a layout_cast right after the load is the
    lowering's layout hint)."""
    return self.cast(ref[...], layout)

  def dot_t(self, a_smem, b_smem):
    """a [M, D] . b [N, D]^T -> [M, N] float32, both in shared memory."""
    if self.interpret:
      return lax.dot_general(a_smem[...], b_smem[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=F32)
    shape = (a_smem.shape[0], b_smem.shape[0])

    def product(acc_ref):
      # b's transpose (plgpu.transpose_ref, deprecated in jax 0.11)
      plgpu.wgmma(acc_ref, a_smem, b_smem.transpose((1, 0)))
      return acc_ref[...]  # waits for the wgmma

    return pl.run_scoped(product, plgpu.ACC(shape, F32))

  def add_dot(self, acc, p, v_smem):
    """acc + p [M, Y] (registers) . v [Y, D] (shared memory), float32."""
    if self.interpret:
      return acc + lax.dot_general(p, v_smem[...], (((1,), (0,)), ((), ())),
                                   preferred_element_type=F32)
    return pl.run_state(lambda acc_ref: plgpu.wgmma(acc_ref, p, v_smem))(
        plgpu.ACC.init(acc))


def _row_axis(x, shape):
  """A per-row vector broadcast over the columns of `shape`."""
  return lax.broadcast_in_dim(x, shape, [0])


def _col_axis(x, shape):
  """A per-column vector broadcast over the rows of `shape`."""
  return lax.broadcast_in_dim(x, shape, [1])


def _key_tiles(t0, shape, dtype=None):
  """BlockSpec of key tiles t0, t0 + 1, ... of a [S, D] ref (swizzled for
  wgmma when dtype is given) or an [S] one."""
  return plgpu.BlockSpec(
      shape, lambda j: (t0 + j,) + (0,) * (len(shape) - 1),
      transforms=() if dtype is None else swizzled(dtype, shape[-1]))


def _ids(kh):
  """(row tile, split group, sequence, kv head) of this program."""
  z = lax.axis_index("bk")
  return (lax.axis_index("rows"), lax.axis_index("group"), lax.div(z, kh),
          lax.rem(z, kh))


def attention(ntiles_gmem, dirty_gmem, q_gmem, k_gmem, v_gmem, ok_gmem,
              o_gmem, lse_gmem, q_smem, q_bar, *, ops: Ops, kh, scale, splits,
              split_tiles, group, stages):
  """Partial outputs o [P, B, K, R, D] and lse [P, B, K, R] of the key
  splits of this program's group (see the module docstring).

  ntiles_gmem [B, R / ROWS] int32: the sequence's key tiles, 0 for a row tile
  without a valid row; dirty_gmem [B, S / BLOCK_K] int32: 1 for a tile with
  an invalid slot; ok_gmem [B, S] float32: 1 for a valid slot.
  """
  i, grp, b, h = _ids(kh)
  d = q_smem.shape[1]
  rows = pl.ds(i * ROWS, ROWS)
  n_tiles = ntiles_gmem[b, i]
  plgpu.copy_gmem_to_smem(q_gmem.at[b, h, rows], q_smem, q_bar.at[0])
  plgpu.barrier_wait(q_bar.at[0])
  k_SxD, v_SxD = k_gmem.at[b, :, h, :], v_gmem.at[b, :, h, :]

  def split_body(split):
    t0, t1 = split_range(n_tiles, split, splits, split_tiles)

    def step(idx, k_smem, v_smem, ok_smem, carry):
      acc, m, l = carry
      s = ops.dot_t(q_smem, k_smem)
      if scale != 1.0:
        s = s * scale
      key_ok = _col_axis(ops.load(ok_smem, WGMMA.reduce(0)), s.shape) > 0.5
      s = jnp.where(key_ok, s, NEG)
      m_new = jnp.maximum(m, s.max(axis=1))
      alpha = jnp.exp(m - m_new)
      p = jnp.where(key_ok, jnp.exp(s - _row_axis(m_new, s.shape)), 0.0)
      l = alpha * l + p.sum(axis=1)

      @pl.when(dirty_gmem[b, t0 + idx[0]] != 0)
      def _zero_invalid_values():
        v = v_smem[...]
        v_ok = _row_axis(ops.load(ok_smem, WGMMA.reduce(1)), v.shape) > 0.5
        v_smem[...] = jnp.where(v_ok, v, jnp.zeros_like(v))
        plgpu.commit_smem()  # the wgmma reads what the threads wrote

      acc = ops.add_dot(acc * _row_axis(alpha, acc.shape),
                        p.astype(v_smem.dtype), v_smem)
      return acc, m_new, l

    carry = (ops.cast(jnp.zeros((ROWS, d), F32), WGMMA),
             ops.cast(jnp.full((ROWS,), NEG, F32), WGMMA.reduce(1)),
             ops.cast(jnp.zeros((ROWS,), F32), WGMMA.reduce(1)))
    acc, m, l = plgpu.emit_pipeline(
        step, grid=(t1 - t0,),
        in_specs=[_key_tiles(t0, (BLOCK_K, d), k_gmem.dtype),
                  _key_tiles(t0, (BLOCK_K, d), v_gmem.dtype),
                  _key_tiles(t0, (BLOCK_K,))],
        max_concurrent_steps=stages, init_carry=carry)(k_SxD, v_SxD,
                                                       ok_gmem.at[b])
    l_safe = jnp.where(l > 0, l, 1.0)
    o = acc / _row_axis(l_safe, acc.shape)
    lse = jnp.where(l > 0, m + jnp.log(l_safe), NEG)

    def store(o_smem, lse_smem):
      o_smem[...] = o.astype(o_smem.dtype)
      lse_smem[...] = lse
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[split, b, h, rows])
      plgpu.copy_smem_to_gmem(lse_smem, lse_gmem.at[split, b, h, rows])
      plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(store,
                  plgpu.SMEM((ROWS, d), o_gmem.dtype,
                             transforms=swizzled(o_gmem.dtype, d)),
                  plgpu.SMEM((ROWS,), F32))

  first = grp * group
  if splits == 1:
    split_body(first)
  else:  # the same body for every group size: the same bits
    last = jnp.minimum(first + group, splits)

    @pl.loop(first, last)
    def _(split):
      split_body(split)


def mass(ntiles_gmem, q_gmem, k_gmem, ok_gmem, lse_gmem, w_gmem, mass_gmem,
         q_smem, lse_smem, w_smem, mass_smem, bar, *, ops: Ops, kh, scale,
         splits, split_tiles, group, score, stages):
  """Per-key sums over this program's score rows (mass_gmem [B, K, n_mt,
  S]) for the key tiles of its split group, from the final lse.

  The scores are made transposed, [keys, rows] = k . q^T (rows are wgmma's N
  side, so a tile of Mr = 32 score-prefix rows costs no more than it
  needs), and each key's sum is a row reduction of that tile. lse_gmem [B,
  K, R], w_gmem [B, R] float32 (1: a score row), ntiles_gmem [B, n_mt]
  (0: no score row in the tile).
  """
  i, grp, b, h = _ids(kh)
  mr, d = q_smem.shape
  rows = pl.ds(i * mr, mr)
  n_tiles = ntiles_gmem[b, i]
  plgpu.copy_gmem_to_smem(q_gmem.at[b, h, rows], q_smem, bar.at[0])
  plgpu.copy_gmem_to_smem(lse_gmem.at[b, h, rows], lse_smem, bar.at[0])
  plgpu.copy_gmem_to_smem(w_gmem.at[b, rows], w_smem, bar.at[0])
  plgpu.barrier_wait(bar.at[0])
  lse = ops.load(lse_smem, WGMMA.reduce(0))
  w = ops.load(w_smem, WGMMA.reduce(0))
  first = grp * group
  last = jnp.minimum(first + group, splits) - 1
  t0 = split_range(n_tiles, first, splits, split_tiles)[0]
  t1 = split_range(n_tiles, last, splits, split_tiles)[1]

  def step(idx, k_smem, ok_smem):
    s = ops.dot_t(k_smem, q_smem)  # [keys, rows]
    if scale != 1.0:
      s = s * scale
    key_ok = _row_axis(ops.load(ok_smem, WGMMA.reduce(1)), s.shape) > 0.5
    if score != "logit":
      s = jnp.exp(s - _col_axis(lse, s.shape))
    s = jnp.where(_col_axis(w, s.shape) > 0.5, s, 0.0)
    # Two output buffers: the copy out of the one written two steps ago is
    # done reading it. (emit_pipeline's own outputs are predicated copies,
    # which interpret mode does not run.)
    out_smem = mass_smem.at[lax.rem(idx[0], 2)]
    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
    out_smem[...] = jnp.where(key_ok, s, 0.0).sum(axis=1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(
        out_smem, mass_gmem.at[b, h, i, pl.ds((t0 + idx[0]) * BLOCK_K,
                                              BLOCK_K)])

  plgpu.emit_pipeline(
      step, grid=(t1 - t0,),
      in_specs=[_key_tiles(t0, (BLOCK_K, d), k_gmem.dtype),
                _key_tiles(t0, (BLOCK_K,))], max_concurrent_steps=stages)(
                    k_gmem.at[b, :, h, :], ok_gmem.at[b])
  plgpu.wait_smem_to_gmem(0)
