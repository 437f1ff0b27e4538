"""Pallas Mosaic GPU (Hopper: TMA pipeline, wgmma) scheduled attention over
the KV cache: Flash-Cache's step, with the Triton kernel's contract
(kernel.scheduled_attention) for what it takes.

Takes bf16 queries q_BxQxHxD (pre-scaled or with `scale`), a bf16 cache
[B, S, K, D] (GQA, H = K * J; D 64 or 128; S a multiple of 64), k_len_B,
q_len_B, exclude_BxS, and the per-key mass or logit sum of score rows
(score_prefix, head_mass). Raises NotImplementedError for the rest, which
api.scheduled_attention sends to the Triton kernel: in-query keys
(k_new / inq_mask), other dtypes or head dims, S not a multiple of 64,
block_r / block_k other than 64.

Layout as the Triton kernel's: the J query heads of a kv head are folded
into the rows (blocks.fold_queries), a program owns 64 of them (wgmma's M,
one warpgroup) for one (sequence, kv head); grid (row tile, split group,
sequence * kv head), row tiles fastest so neighbours share K/V in L2. Keys
in 64-slot tiles from slot 0, in key splits of a fixed size right-anchored
on the row's last tile (tiling.key_splits / split_range: the Triton
kernel's default split sizes), each from a fresh online softmax into its
own float32 partial, merged in a fixed order by combine.merge_splits
(a Triton kernel). So a row's bits depend neither on the batch (nor on the
split group, which follows it) nor on left padding of the keys by multiples
of 64 excluded slots: such pad tiles pass through the softmax and the merge
as exact no-ops. The mass is a second Mosaic kernel over the final lse
(mosaic_kernels.mass), its per-tile partials summed by reference.tree_sum
as the Triton kernel's are. Bits differ from the Triton kernel's (other
products and orders), within the reference's tolerance.

interpret=True runs Mosaic GPU's interpret mode on the CPU (its
products as XLA dots: mosaic_kernels.Ops) and the merge in Pallas
interpret mode.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.attention import blocks, combine
from pallas_kernels.attention import mosaic_kernels as mk
from pallas_kernels.attention.reference import sum_heads
from pallas_kernels.attention.tiling import (DEFAULT_TILING, Tiling,
                                             _default_block_r, key_splits)
from pallas_kernels.mosaic_gpu import (SEMANTICS, interpret_params,
                                       reset_interpret_state)

__all__ = ["scheduled_attention", "reset_interpret_state"]

ROWS, BLOCK_K, F32 = mk.ROWS, mk.BLOCK_K, mk.F32
DEFAULT_STAGES = 2  # K/V tiles in flight: 2 x 32 KiB at D = 128


def _check(q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD, k_new_BxIxKxD,
           inq_mask_BxQxI, block_r, block_k):
  """NotImplementedError for what this kernel does not take."""
  _, _, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1:3]
  if k_new_BxIxKxD is not None or inq_mask_BxQxI is not None:
    raise NotImplementedError("in-query keys (k_new): the Triton kernel's")
  dtypes = {x.dtype for x in (q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD)}
  if dtypes != {jnp.dtype(jnp.bfloat16)}:
    raise NotImplementedError(f"dtypes {sorted(map(str, dtypes))}: "
                              "bfloat16 only")
  if d not in (64, 128) or h % kh:
    raise NotImplementedError(f"head_dim {d} (64 or 128) / heads {h}, {kh}")
  if s % BLOCK_K:
    raise NotImplementedError(f"S = {s} must be a multiple of {BLOCK_K}")
  if block_r not in (None, ROWS) or block_k not in (None, BLOCK_K):
    raise NotImplementedError(f"block_r {block_r}, block_k {block_k}: "
                              f"{ROWS} rows and {BLOCK_K} keys only")


def _call(body, out_type, scratch, grid, interpret):
  return plgpu.kernel(
      body, out_type=out_type, grid=grid, grid_names=("rows", "group", "bk"),
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(lowering_semantics=SEMANTICS),
      interpret=interpret_params() if interpret else None)


def _tiles_if(n_tiles_B, flags_BxR, rows):
  """[B, R / rows] int32: n_tiles where the row tile has a flagged row."""
  b = flags_BxR.shape[0]
  any_BxT = jnp.any(flags_BxR.reshape(b, -1, rows), axis=-1)
  return jnp.where(any_BxT, n_tiles_B[:, None], 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_r", "block_k", "split_tiles", "num_splits", "num_warps",
    "num_stages", "interpret", "head_mass", "score_prefix", "score",
    "tiling", "split_group"))
def scheduled_attention(q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD, k_len_B,
                        q_len_B, *, scale: float, k_new_BxIxKxD=None,
                        v_new_BxIxKxD=None, inq_mask_BxQxI=None,
                        exclude_BxS=None, score_rows_BxQ=None,
                        block_r: int | None = None, block_k: int | None = None,
                        split_tiles: int | None = None,
                        num_splits: int | None = None,
                        num_warps: int | None = None,
                        num_stages: int | None = None,
                        interpret: bool = False, head_mass: bool = False,
                        score_prefix: int | None = None, score: str = "mass",
                        tiling: Tiling = DEFAULT_TILING,
                        split_group: int | None = None):
  """Same contract and options as kernel.scheduled_attention for what it
  takes (module docstring); num_stages: K/V tiles in flight (default 2);
  num_warps is the Triton kernel's and ignored (one warpgroup)."""
  del v_new_BxIxKxD, num_warps
  _check(q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD, k_new_BxIxKxD,
         inq_mask_BxQxI, block_r, block_k)
  b, q, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1:3]
  g = h // kh
  rr = q * g
  n_rt = pl.cdiv(rr, ROWS)
  rrp = n_rt * ROWS
  # The Triton kernel's default split size (from its own row tiles).
  split_tiles, splits, group = key_splits(
      b, kh, pl.cdiv(rr, _default_block_r(rr, tiling.max_block_r)), s,
      BLOCK_K, split_tiles, num_splits, split_group, tiling)
  stages = num_stages or DEFAULT_STAGES
  ops = mk.Ops(interpret)
  grid_of = lambda tiles: (tiles, pl.cdiv(splits, group), b * kh)
  opts = dict(ops=ops, kh=kh, scale=scale, splits=splits,
              split_tiles=split_tiles, group=group, stages=stages)

  valid_BxQ = jnp.arange(q)[None, :] < q_len_B[:, None]
  valid_BxR = blocks.fold_rows(valid_BxQ, g, rrp)
  # Rows past q_len may hold anything (NaN): zero them, zero their output.
  q_BxKxRxD = jnp.where(valid_BxR[:, None, :, None],
                        blocks.fold_queries(q_BxQxHxD, kh, rrp), 0)
  k_len = jnp.minimum(k_len_B.astype(jnp.int32), s)
  ok_BxS = jnp.arange(s)[None, :] < k_len[:, None]
  if exclude_BxS is not None:
    ok_BxS &= ~exclude_BxS
  dirty_BxT = jnp.any(~ok_BxS.reshape(b, s // BLOCK_K, BLOCK_K),
                      -1).astype(jnp.int32)
  ok_BxS = ok_BxS.astype(F32)
  n_tiles_B = pl.cdiv(k_len, BLOCK_K)

  o_dtype = q_BxQxHxD.dtype if splits == 1 else F32
  o_P, lse_P = _call(
      functools.partial(mk.attention, **opts),
      [jax.ShapeDtypeStruct((splits, b, kh, rrp, d), o_dtype),
       jax.ShapeDtypeStruct((splits, b, kh, rrp), F32)],
      [plgpu.SMEM((ROWS, d), q_BxQxHxD.dtype,
                  transforms=mk.swizzled(q_BxQxHxD.dtype, d)),
       plgpu.Barrier(num_arrivals=1, num_barriers=1)],
      grid_of(n_rt), interpret)(
          _tiles_if(n_tiles_B, valid_BxR, ROWS), dirty_BxT, q_BxKxRxD,
          k_cache_BxSxKxD, v_cache_BxSxKxD, ok_BxS)
  if splits == 1:
    o_BxKxRxD, lse_BxKxR = o_P[0], lse_P[0]
  else:
    o_BxKxRxD, lse_BxKxR = combine.merge_splits(
        o_P, lse_P, block_r=ROWS, out_dtype=q_BxQxHxD.dtype,
        interpret=interpret)
  o_BxQxHxD = jnp.where(valid_BxQ[:, :, None, None],
                        blocks.unfold_output(o_BxKxRxD, q, g), 0)
  if score_rows_BxQ is None:
    return o_BxQxHxD, None

  if score_prefix is not None:
    score_rows_BxQ = score_rows_BxQ & (jnp.arange(q) < score_prefix)[None]
  w_BxR = blocks.fold_rows(valid_BxQ & score_rows_BxQ, g, rrp)
  # The score prefix alone: one tile of 32 rows (wgmma's N side; a copy
  # moves a multiple of 128 bytes: 32 float32 lse at least).
  mr = ROWS if score_prefix is None else max(
      32, 1 << (score_prefix * g - 1).bit_length())
  mr, n_mt = (mr, 1) if mr < ROWS else (ROWS, n_rt)
  mass_part = _call(
      functools.partial(mk.mass, score=score, **opts),
      jax.ShapeDtypeStruct((b, kh, n_mt, s), F32),
      [plgpu.SMEM((mr, d), q_BxQxHxD.dtype,
                  transforms=mk.swizzled(q_BxQxHxD.dtype, d)),
       plgpu.SMEM((mr,), F32), plgpu.SMEM((mr,), F32),
       plgpu.SMEM((2, BLOCK_K), F32),
       plgpu.Barrier(num_arrivals=3, num_barriers=1)],
      grid_of(n_mt), interpret)(
          _tiles_if(n_tiles_B, w_BxR[:, :n_mt * mr], mr), q_BxKxRxD,
          k_cache_BxSxKxD, ok_BxS, lse_BxKxR, w_BxR.astype(F32))
  # Partials exist only for row tiles holding a score row and slots < k_len.
  has_score = jnp.any(w_BxR[:, :n_mt * mr].reshape(b, n_mt, mr), -1)
  mass_BxKxS = blocks.sum_mass_tiles(mass_part, has_score, k_len)
  return o_BxQxHxD, mass_BxKxS if head_mass else sum_heads(mass_BxKxS)
