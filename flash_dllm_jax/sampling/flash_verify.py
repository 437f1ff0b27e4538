"""Flash-Verify: the model checks its own drafts in a second, small pass.

After the draft (Flash-Cache) forward commits its confident tokens, up to
block_m // 2 of the remaining window candidates, in draft-confidence order,
are verified. The verify pass holds 2 * block_m query rows per sequence:
  recent  the 2*block_m - 2*S most recently committed tokens (re-encoded),
  draft   the S candidates holding their draft tokens,
  mask    the S candidates holding [MASK],
attending to every cache slot except the query slots, plus each other:
  recent rows see recent and mask rows;
  draft row i sees recent, drafts j <= i and masks j > i;
  mask row i sees recent, drafts j < i and masks j >= i;
so mask row i asks "given the earlier drafts, how likely is draft i?". The
longest prefix whose cumulative product of those probabilities stays >= gamma
is accepted. The pass does not write the cache.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

RECENT, DRAFT, MASK, UNUSED = 0, 1, 2, 3


class VerifyPlan(NamedTuple):
  """Inputs of one verify pass; Q = 2 * block_m rows, C = block_m // 2.

  slots_BxQ: cache slot of each row (-1 = unused); tokens_BxQ: its token;
  kind_BxQ / rank_BxQ: RECENT/DRAFT/MASK/UNUSED and the candidate index;
  inq_BxQxQ: which rows see which; exclude_BxS: the query slots;
  mask_rows_BxC: the row of mask view i (0 where i >= S_B); S_B: candidates.
  """

  slots_BxQ: jax.Array
  tokens_BxQ: jax.Array
  kind_BxQ: jax.Array
  rank_BxQ: jax.Array
  inq_BxQxQ: jax.Array
  exclude_BxS: jax.Array
  mask_rows_BxC: jax.Array
  S_B: jax.Array


def plan(tokens_BxN: jax.Array, recent_key_BxN: jax.Array,
         cand_slots_BxC: jax.Array, drafts_BxC: jax.Array, n_cand_B: jax.Array,
         block_m: int, mask_id: int) -> VerifyPlan:
  """Lays out the verify rows of every sequence.

  recent_key_BxN: larger = committed more recently; -inf for positions that
  may not be re-encoded (masks, padding). cand_slots_BxC: candidate slots in
  draft-confidence order (-1 = none), drafts_BxC their draft tokens.
  """
  b, n = tokens_BxN.shape
  q, c = 2 * block_m, cand_slots_BxC.shape[1]
  s_B = jnp.minimum(n_cand_B, c)
  t_B = q - 2 * s_B
  r_Q = jnp.arange(q)
  recent_order_BxN = jnp.argsort(-recent_key_BxN, axis=1, stable=True)
  n_recent_B = jnp.sum(recent_key_BxN > -jnp.inf, axis=1)
  recent_BxQ = recent_order_BxN[:, :q] if n >= q else jnp.pad(
      recent_order_BxN, ((0, 0), (0, q - n)), constant_values=-1)

  is_recent = r_Q[None, :] < jnp.minimum(t_B, n_recent_B)[:, None]
  is_draft = (r_Q[None, :] >= t_B[:, None]) & (r_Q[None, :] < (t_B + s_B)[:, None])
  is_mask = (r_Q[None, :] >= (t_B + s_B)[:, None])
  rank_BxQ = jnp.where(is_draft, r_Q - t_B[:, None],
                       jnp.where(is_mask, r_Q - t_B[:, None] - s_B[:, None], 0))
  rank_BxQ = jnp.clip(rank_BxQ, 0, c - 1)
  kind_BxQ = jnp.where(is_recent, RECENT, jnp.where(
      is_draft, DRAFT, jnp.where(is_mask, MASK, UNUSED)))
  cand_slot_BxQ = jnp.take_along_axis(cand_slots_BxC, rank_BxQ, axis=1)
  slots_BxQ = jnp.where(is_recent, recent_BxQ,
                        jnp.where(is_draft | is_mask, cand_slot_BxQ, -1))
  recent_tok_BxQ = jnp.take_along_axis(tokens_BxN, jnp.maximum(recent_BxQ, 0), 1)
  draft_tok_BxQ = jnp.take_along_axis(drafts_BxC, rank_BxQ, axis=1)
  tokens_BxQ = jnp.where(is_recent, recent_tok_BxQ, jnp.where(
      is_draft, draft_tok_BxQ.astype(tokens_BxN.dtype), mask_id))

  row_k, col_k = kind_BxQ[:, :, None], kind_BxQ[:, None, :]
  row_i, col_j = rank_BxQ[:, :, None], rank_BxQ[:, None, :]
  sees = (col_k == RECENT) | (
      (row_k == RECENT) & (col_k == MASK)) | (
      (row_k == DRAFT) & (((col_k == DRAFT) & (col_j <= row_i))
                          | ((col_k == MASK) & (col_j > row_i)))) | (
      (row_k == MASK) & (((col_k == DRAFT) & (col_j < row_i))
                         | ((col_k == MASK) & (col_j >= row_i))))
  inq_BxQxQ = sees & (row_k != UNUSED) & (col_k != UNUSED)
  exclude_BxS = jnp.zeros((b, n), bool).at[
      jnp.arange(b)[:, None], jnp.where(slots_BxQ >= 0, slots_BxQ, n)].set(
          True, mode="drop")
  i_C = jnp.arange(c)
  mask_rows_BxC = jnp.where(i_C[None, :] < s_B[:, None],
                            (t_B + s_B)[:, None] + i_C[None, :], 0)
  return VerifyPlan(slots_BxQ, tokens_BxQ, kind_BxQ, rank_BxQ, inq_BxQxQ,
                    exclude_BxS, mask_rows_BxC, s_B)


def accept(p_BxC: jax.Array, s_B: jax.Array, gamma: float) -> jax.Array:
  """[B, C] bool: the longest prefix (i < S) with prod_{j<=i} p_j >= gamma."""
  c = p_BxC.shape[1]
  real_BxC = jnp.arange(c)[None, :] < s_B[:, None]
  cum_BxC = jnp.cumprod(jnp.where(real_BxC, p_BxC, 1.0), axis=1)
  return real_BxC & (cum_BxC >= gamma)
