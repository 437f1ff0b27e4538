"""The per-program body of the Triton scheduled attention (kernel.py).

One program owns R folded rows (query x head of one kv head) of one
sequence and the key splits [first, last] of its split group; for each
split, from a fresh state, it runs the online softmax over the in-query
keys (last split only) and the split's cache tiles, then writes the split's
partial (or, `merged`, folds every split with combine.merge_step). With
`do_mass` it re-streams the K tiles and sums exp(s - lse) (or the scaled
logits, score="logit") per key over its score rows.
"""

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.attention import combine
from pallas_kernels.attention.tiling import split_range

NEG = combine.NEG  # finite "minus infinity": exp(NEG - NEG) is no NaN
VALID, SCORE = 1, 2  # bits of the per-row info byte


def _dot_t(a, b):
  """a [M, D] . b [Y, D]^T -> [M, Y] float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                         preferred_element_type=jnp.float32)


def attention_program(*refs, scale, s, block_k, splits, split_tiles, group,
                      has_excl, has_new, t_new, do_attn, do_mass, score,
                      merged, has_scale=False):
  """The Pallas body; refs in blocks.inputs' order, then the outputs."""
  refs = list(refs)
  klen_ref, q_ref, k_ref, v_ref, info_ref = refs[:5]
  del refs[:5]
  ks_ref, vs_ref = (refs[:2] if has_scale else (None, None))
  del refs[:2 if has_scale else 0]
  excl_ref = refs.pop(0) if has_excl else None
  knew_ref, vnew_ref, inq_ref = (refs[:3] if has_new else (None,) * 3)
  del refs[:3 if has_new else 0]
  lse_in_ref = None if do_attn else refs.pop(0)
  o_ref, lse_ref = (refs[:2] if do_attn else (None, None))
  mass_ref = refs[-1] if do_mass else None

  r, d = q_ref.shape
  first = pl.program_id(1) * group  # this program's splits: [first, last]
  last = jnp.minimum(first + group, splits) - 1
  info = info_ref[...].astype(jnp.int32)
  row_ok = (info & VALID) != 0
  q = q_ref[...]

  # Triton casts no int literal to float8: a float8 cache pads with 0.0.
  zero = 0.0 if k_ref.dtype == jnp.float8_e4m3fn else 0
  n_tiles = pl.cdiv(jnp.minimum(klen_ref[()], s), block_k)
  n_tiles = jnp.where(jnp.max(info & VALID) > 0, n_tiles, 0)
  tiles = lambda split: split_range(n_tiles, split, splits, split_tiles)

  def key_tile(t):
    """Slots of tile t, their validity, the row x key mask, and the
    scaled scores q.k [R, block_k] (an 8-bit K in bf16, exact, its
    per-slot scales applied to the score columns)."""
    cols = t * block_k + jnp.arange(block_k)
    key_ok = cols < jnp.minimum(klen_ref[()], s)
    if has_excl:
      ex = plgpu.load(excl_ref.at[pl.ds(t * block_k, block_k)],
                      mask=key_ok, other=1)
      key_ok &= ex == 0
    rows = pl.ds(t * block_k, block_k)
    k = plgpu.load(k_ref.at[rows, :], mask=key_ok[:, None], other=zero)
    if has_scale:
      ks = plgpu.load(ks_ref.at[rows], mask=key_ok, other=0)
      s_QJxY = _dot_t(q, k.astype(q.dtype)) * scale * ks.astype(
          jnp.float32)[None, :]
    else:
      s_QJxY = _dot_t(q, k) * scale
    return rows, key_ok, s_QJxY, row_ok[:, None] & key_ok[None, :]

  def value_tile(rows, key_ok):
    """V of a tile (bf16 for an 8-bit cache) and its per-slot scales."""
    v = plgpu.load(v_ref.at[rows, :], mask=key_ok[:, None], other=zero)
    if not has_scale:
      return v, None
    vs = plgpu.load(vs_ref.at[rows], mask=key_ok, other=0)
    return v.astype(q.dtype), vs.astype(jnp.float32)

  def softmax_step(carry, s_QJxY, mask, v, vs=None):
    acc, m, l = carry
    s_QJxY = jnp.where(mask, s_QJxY, NEG)
    m_new = jnp.maximum(m, jnp.max(s_QJxY, axis=1))
    alpha = jnp.exp(m - m_new)
    p = jnp.where(mask, jnp.exp(s_QJxY - m_new[:, None]), 0.0)
    l = alpha * l + jnp.sum(p, axis=1)
    pw = p if vs is None else p * vs[None, :]  # V's scales, per key
    pv = lax.dot_general(pw.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)
    return acc * alpha[:, None] + pv, m_new, l

  if do_attn:
    if has_new:
      t_p = max(16, 1 << (t_new - 1).bit_length())
      t_ok = jnp.arange(t_p) < t_new
      kn = plgpu.load(knew_ref.at[pl.ds(0, t_p), :], mask=t_ok[:, None],
                      other=0)
      vn = plgpu.load(vnew_ref.at[pl.ds(0, t_p), :], mask=t_ok[:, None],
                      other=0)
      inq = plgpu.load(inq_ref.at[:, pl.ds(0, t_p)], mask=t_ok[None, :],
                       other=0)

    def attn_body(t, carry):
      rows, key_ok, s_QJxY, mask = key_tile(t)
      return softmax_step(carry, s_QJxY, mask, *value_tile(rows, key_ok))

    def attn_split(split):
      """One split from a fresh state: its partial (o, lse), float32."""
      carry = (jnp.zeros((r, d), jnp.float32),
               jnp.full((r,), NEG, jnp.float32), jnp.zeros((r,), jnp.float32))
      if has_new:
        mask = (inq != 0) & row_ok[:, None] & (split == splits - 1)
        carry = softmax_step(carry, _dot_t(q, kn) * scale, mask, vn)
      acc, m, l = lax.fori_loop(*tiles(split), attn_body, carry)
      o = acc / jnp.where(l > 0, l, 1.0)[:, None]
      return o, jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), NEG)

    def write(slot, o, lse):
      o_ref[slot] = o.astype(o_ref.dtype)
      lse_ref[slot] = lse

    if splits == 1:
      o, lse = attn_split(first)
      write(0, o, lse)
    elif merged:  # every split here, merged as combine's kernel would
      o, lse = combine.merge_end(lax.fori_loop(
          0, splits, lambda j, c: combine.merge_step(c, *attn_split(j)),
          combine.merge_start(r, d)))
      write(0, o, lse)
    else:  # the same body for every group size: the same bits
      lax.fori_loop(first, last + 1,
                    lambda j, c: (write(j, *attn_split(j)), c)[1],
                    first)  # yield the carried value, not a literal
  else:
    lse = lse_in_ref[...]

  if do_mass:  # one lse: fused (one split) or the merged one (mass only)
    t0, t1 = tiles(first)[0], tiles(last)[1]  # the group's splits' tiles
    score_rows = row_ok & ((info & SCORE) != 0)
    m_t0 = jnp.where(jnp.max(score_rows.astype(jnp.int32)) > 0, t0, t1)

    def mass_body(t, carry):
      rows, _, s_QJxY, mask = key_tile(t)
      mask &= score_rows[:, None]
      p = jnp.where(mask, s_QJxY if score == "logit"
                    else jnp.exp(s_QJxY - lse[:, None]), 0.0)
      plgpu.store(mass_ref.at[rows], jnp.sum(p, axis=0),
                  mask=t * block_k + jnp.arange(block_k) < s)
      return carry  # yield the carried value: Triton can't yield a literal

    lax.fori_loop(m_t0, t1, mass_body, t0)
