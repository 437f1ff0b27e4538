"""Pallas (Triton) scheduled attention: ragged cache + in-query keys, one pass.

Layout: the J query heads of kv head k are folded into the row axis, so a
program owns R rows of the flattened (query, group) axis of one (sequence, kv
head) and every K/V tile it streams serves all J heads. Grid (row tile, key
split group, sequence * kv head); row tiles vary fastest so neighbouring
programs share K/V tiles in L2. For each key split of its group, one after
another, a program runs one online softmax from a fresh state over
  1. the in-query keys (k_new, T <= 64, per-row boolean mask), last split
     only,
  2. cache tiles [t0, t1) of the split, t1 <= cdiv(k_len, block_k): tiles
     past the sequence's length are never loaded,
in float32, and writes the split's own partial: the group
(tiling.split_group_for, which may follow the batch size) sets the program
count and no bit of any result. Excluded cache slots come as an int8 [B, S]
mask, loaded once per key tile (one contiguous vector shared by all rows):
cheaper in the kernel than comparing every key against a position list.

Key tiles start at slot 0; key splits have a fixed size (split_tiles) and are
right-anchored at the row's last tile (tiling.split_range), the in-query keys
going with the last split. Left padding of the keys by a multiple of
tiling.PAD_ALIGN (excluded slots) thus keeps every real key in its tile and
split and only adds leading tiles and splits of pad keys, exact no-ops of the
online softmax (m stays NEG, alpha = 1, p = 0) and of the merge: a row's
output and mass are the same bits with or without such padding.

With key splits in several programs, a small second kernel merges the
splits' partial outputs by log-sum-exp (combine.py); a program that holds
every split (the group a batch of 32 takes under the `auto` rule) merges
them itself with the same step, in the same order, and writes no partials:
the same bits, without a float32 partial per split through memory.

Mass per key (optional): normalisation is only known once all keys are seen,
so after the online softmax the program re-streams the K tiles (not V) and
sums exp(s - lse) over its score rows; the per (row tile, kv head) partials
are summed over row tiles, then over heads, each as a fixed tree of adds
(`reference.tree_sum`). With key splits in several programs the lse is
global only after the split combine, so the same body runs again as a
mass-only call (a program over the tiles of its split group); it also does
when the score rows are a short prefix of the queries (`score_prefix`), on
one tile of just those rows.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.attention import blocks, combine
from pallas_kernels.attention.program import SCORE, VALID, attention_program
from pallas_kernels.attention.reference import sum_heads
from pallas_kernels.attention.tiling import (
    DEFAULT_TILING, Tiling, _default_block_r, check_block_k, key_splits)


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_r", "block_k", "split_tiles", "num_splits", "num_warps",
    "num_stages", "interpret", "head_mass", "score_prefix", "score",
    "tiling", "split_group", "kv_repeat"))
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
                        split_group: int | None = None,
                        k_scale_BxSxK=None, v_scale_BxSxK=None,
                        kv_repeat: int = 1):
  """Same contract as reference.scheduled_attention.

  block_r: rows (query x folded head) per program; block_k: keys per tile
  (None: tiling.block_k); num_stages None: tiling.num_stages;
  split_tiles: key tiles per key split (flash-decoding style splits, merged
  by log-sum-exp in combine.py); None takes tiling.default_split_tiles
  (tiling.split_target, tiling.split_tiles; tiling.max_block_r bounds a None
  block_r), which ignores the batch size and S so that a row's result
  depends neither on the other rows nor on its left padding (pass
  `split_tiles_for` of the global shapes when running on a shard of the
  heads). num_splits: instead, about this many splits over S (benchmark
  sweeps; S-dependent, so not padding-invariant). split_group: key splits
  one program runs one after another, each from a fresh state into its own
  partial, so no result depends on it; None takes tiling.split_group_for
  of the batch (1 unless tiling.group_target is set). head_mass: return
  the mass per KV head, mass_BxKxS.
  score_prefix: score rows are among the first score_prefix queries (later
  ones are ignored); when their folded rows fit a smaller tile than block_r,
  the mass runs as its own call on that tile alone, so it does not re-score
  every row of the first tile (Flash-Cache's window is its first queries).
  score: what is summed per key, "mass" (softmax probability) or "logit"
  (the pre-softmax scaled q.k, no normalisation needed).
  k_scale_BxSxK, v_scale_BxSxK: an 8-bit cache's per-slot scales
  (kv_quant.py); the kernel reads the 8-bit K/V and dequantizes per tile.
  kv_repeat: each cache row (K/V, scales, exclude_BxS: [B / kv_repeat,
  ...]) serves kv_repeat consecutive query sequences, read in place (the
  decode blocks of one sequence, each with its own k_len).
  Raises NotImplementedError for shapes the Triton lowering can't tile,
  ValueError for a block_k not dividing tiling.PAD_ALIGN or bad splits.
  """
  b, q, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1:3]
  block_k = block_k or tiling.block_k
  num_stages = num_stages or tiling.num_stages
  has_new, has_excl = k_new_BxIxKxD is not None, exclude_BxS is not None
  t_new = k_new_BxIxKxD.shape[1] if has_new else 0
  check_block_k(block_k)
  if k_cache_BxSxKxD.shape[0] * kv_repeat != b:
    raise ValueError(f"{b} query sequences for {k_cache_BxSxKxD.shape[0]} "
                     f"cache rows x kv_repeat {kv_repeat}")
  if d < 16 or d & (d - 1) or h % kh:
    raise NotImplementedError(f"unsupported head_dim {d} / heads {h}, {kh}")
  if t_new > 64:
    raise NotImplementedError(f"{t_new} in-query keys (at most 64)")
  g, f32 = h // kh, jnp.float32
  rr = q * g
  block_r = block_r or _default_block_r(rr, tiling.max_block_r)
  n_rt = pl.cdiv(rr, block_r)
  rrp = n_rt * block_r
  split_tiles, splits, group = key_splits(
      b, kh, n_rt, s, block_k, split_tiles, num_splits, split_group, tiling)
  do_mass = score_rows_BxQ is not None

  q_BxKxQJxD = blocks.fold_queries(q_BxQxHxD, kh, rrp)
  valid_BxQ = jnp.arange(q)[None, :] < q_len_B[:, None]
  info_BxQ = valid_BxQ.astype(jnp.int8) * VALID
  if do_mass:
    if score_prefix is not None:
      score_rows_BxQ = score_rows_BxQ & (jnp.arange(q) < score_prefix)[None]
    info_BxQ += (valid_BxQ & score_rows_BxQ).astype(jnp.int8) * SCORE
  info_BxQJ = blocks.fold_rows(info_BxQ, g, rrp)
  bk = lambda z: (z // kh, z % kh)
  new = (k_new_BxIxKxD, v_new_BxIxKxD, blocks.fold_rows(
      inq_mask_BxQxI.astype(jnp.int8), g, rrp)) if has_new else None
  has_scale = k_scale_BxSxK is not None
  specs = lambda rows: blocks.inputs(
      rows, kh, k_len_B, q_BxKxQJxD, k_cache_BxSxKxD, v_cache_BxSxKxD,
      info_BxQJ, exclude_BxS, new,
      (k_scale_BxSxK, v_scale_BxSxK) if has_scale else None, kv_repeat)
  in_specs, args = specs(block_r)
  # A mass of the score prefix alone: one tile of mass_r rows per sequence.
  mass_r = block_r if score_prefix is None else max(
      16, 1 << (score_prefix * g - 1).bit_length())
  prefix_mass = do_mass and mass_r < block_r
  mass_r, n_mt = (mass_r, 1) if prefix_mass else (block_r, n_rt)
  mass_spec, mass_shape = blocks.mass_output(b, kh, n_mt, s)
  call = lambda rows, tiles: functools.partial(
      pl.pallas_call, grid=(tiles, pl.cdiv(splits, group), b * kh),
      interpret=interpret,
      compiler_params=plgpu.CompilerParams(
          num_warps=num_warps or (4 if rows <= 64 else 8),
          num_stages=num_stages))
  # A program holding every split merges them itself: no partials.
  merged = 1 < splits == group
  body = functools.partial(
      attention_program, scale=scale, s=s, block_k=block_k, splits=splits,
      split_tiles=split_tiles, group=group, has_excl=has_excl, has_new=has_new,
      t_new=t_new, score=score, merged=merged, has_scale=has_scale)

  whole = splits == 1 or merged
  o_dtype = q_BxQxHxD.dtype if whole else f32
  fused_mass = do_mass and whole and not prefix_mass
  out_specs, out_shape = blocks.outputs(1 if whole else splits, b, kh, rrp,
                                        block_r, d, o_dtype)
  if fused_mass:
    out_specs.append(mass_spec)
    out_shape.append(mass_shape)
  outs = call(block_r, n_rt)(functools.partial(body, do_attn=True,
                                               do_mass=fused_mass),
              in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
              name="scheduled_attention")(*args)
  o_P, lse_P = outs[0], outs[1]
  if whole:
    o_BxKxQJxD, lse_BxKxQJ = o_P[0], lse_P[0]
  else:
    o_BxKxQJxD, lse_BxKxQJ = combine.merge_splits(
        o_P, lse_P, block_r=block_r, out_dtype=q_BxQxHxD.dtype,
        interpret=interpret)
  o_BxQxHxD = blocks.unfold_output(o_BxKxQJxD, q, g)
  if not do_mass:
    return o_BxQxHxD, None

  if fused_mass:
    mass_part = outs[2]
  else:
    m_specs, m_args = specs(mass_r)
    mass_part = call(mass_r, n_mt)(
        functools.partial(body, do_attn=False, do_mass=True),
        in_specs=m_specs + [pl.BlockSpec(
            (None, None, mass_r), lambda i, j, z: (*bk(z), i))],
        out_specs=mass_spec, out_shape=mass_shape,
        name="scheduled_attention_mass")(*m_args, lse_BxKxQJ)
  # Partials exist only for row tiles holding a score row and slots < k_len.
  has_score = jnp.any((info_BxQJ[:, :n_mt * mass_r].reshape(
      b, n_mt, mass_r) & SCORE) != 0, -1)
  mass_BxKxS = blocks.sum_mass_tiles(mass_part, has_score, k_len_B)
  return o_BxQxHxD, mass_BxKxS if head_mass else sum_heads(mass_BxKxS)
