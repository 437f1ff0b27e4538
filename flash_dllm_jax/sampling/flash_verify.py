"""Flash-Verify: the model checks its own drafts in a second, small pass.

After the draft (Flash-Cache) forward commits its confident tokens, up to
block_m // 2 of the remaining window candidates before the answer's end, in
draft-confidence order, are verified. The verify pass holds 2 * block_m
query rows per sequence:
  recent  the tail of the reference's list of decoded positions (the step's
          draft commits, then the list as flash_budget keeps it),
          re-encoded, filling the rows the others leave (2*block_m - 2*S
          for LLaDA),
  draft   the S candidates holding their draft tokens,
  mask    the S candidates holding [MASK],
attending to every cache slot except the query slots, plus each other:
  recent rows see recent and mask rows;
  draft row i sees recent, drafts j <= i and masks j > i;
  mask row i sees recent, drafts j < i and masks j >= i;
so mask row i asks "given the earlier drafts, how likely is draft i?". The
longest prefix whose cumulative product of those probabilities stays >= gamma
is accepted. The pass does not write the cache.

Dream (shift = 1) predicts position i from the row at position i - 1, so the
probability of draft i is read from a *predictor row*: position c_i - 1
(c_i = candidate i's slot) in candidate i's mask view, i.e. with exactly
mask row i's visibility (recent, drafts j < i, masks j >= i, so c_i itself
is [MASK] and the earlier candidates hold their drafts). Its token is what
that view holds at c_i - 1: draft k if c_i - 1 is candidate k < i, else the
sequence's token there ([MASK] for a later candidate or an unverified mask).
A predictor row is a read-out query only: no row sees it, itself included,
because the view already holds one copy of c_i - 1 (draft or mask row k,
a recent row, or the cache slot, which stays visible since predictor slots
are not excluded). When c_i - 1 is the previous candidate c_{i-1}, draft
row i - 1 is that row exactly (same token, slot and visibility, and it is
its own copy of c_{i-1}), so it is read instead and no row is added.
Otherwise (including c_i - 1 = c_k for k < i - 1, whose draft row sees the
candidates between k and i as masks, or k > i, whose mask row sees draft i)
a predictor row is added after the mask rows, taking a recent row's place:
at most 3 * S <= 1.5 * block_m rows are candidates' own, so the recent rows
still cover every token committed in the step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from flash_dllm_jax.model import CachedExtras
from flash_dllm_jax.sampling import select, top_logprobs

RECENT, DRAFT, MASK, UNUSED, PREDICT = 0, 1, 2, 3, 4


class VerifyPlan(NamedTuple):
  """Inputs of one verify pass; Q = 2 * block_m rows, C = block_m // 2.

  slots_BxQ: cache slot of each row (-1 = unused); tokens_BxQ: its token;
  kind_BxQ / rank_BxQ: RECENT/DRAFT/MASK/UNUSED/PREDICT and the candidate
  index; inq_BxQxQ: which rows see which; exclude_BxS: the slots hidden from
  the cache (those of the recent, draft and mask rows); mask_rows_BxC: the
  row of mask view i; score_rows_BxC: the row whose logits give candidate i's
  probability (the mask row, or for Dream its predictor row); both 0 where
  i >= S_B. S_B: candidates.
  """

  slots_BxQ: jax.Array
  tokens_BxQ: jax.Array
  kind_BxQ: jax.Array
  rank_BxQ: jax.Array
  inq_BxQxQ: jax.Array
  exclude_BxS: jax.Array
  mask_rows_BxC: jax.Array
  score_rows_BxC: jax.Array
  S_B: jax.Array


def plan(tokens_BxN: jax.Array, recent_key_BxN: jax.Array | None,
         cand_slots_BxC: jax.Array, drafts_BxC: jax.Array, n_cand_B: jax.Array,
         block_m: int, mask_id: int, shift: int = 0,
         rows: int | None = None) -> VerifyPlan:
  """Lays out the verify rows of every sequence.

  recent_key_BxN: larger = committed more recently; -inf for positions that
  may not be re-encoded (masks, padding); None: no recent rows. cand_slots_BxC:
  candidate slots in draft-confidence order (-1 = none), drafts_BxC their
  draft tokens. shift: the model's logits shift (1 for Dream: predictor
  rows). rows: Q, the rows a sequence holds (default 2 * block_m; at least
  (2 + shift) * C without recent rows).
  """
  b, n = tokens_BxN.shape
  q, c = rows or 2 * block_m, cand_slots_BxC.shape[1]
  if recent_key_BxN is None:
    recent_key_BxN = jnp.full((b, n), -jnp.inf)
  s_B = jnp.minimum(n_cand_B, c)
  r_Q, i_C = jnp.arange(q), jnp.arange(c)
  real_BxC = i_C[None, :] < s_B[:, None]
  drafts_BxC = drafts_BxC.astype(tokens_BxN.dtype)
  if shift:
    prev_BxC = jnp.roll(cand_slots_BxC, 1, axis=1)  # c_{i-1}
    reuse_BxC = real_BxC & (i_C[None, :] > 0) & (
        prev_BxC == cand_slots_BxC - 1)
    need_BxC = real_BxC & ~reuse_BxC
  else:
    reuse_BxC = need_BxC = jnp.zeros_like(real_BxC)
  p_B = need_BxC.sum(1)
  t_B = q - 2 * s_B - p_B
  recent_order_BxN = jnp.argsort(-recent_key_BxN, axis=1, stable=True)
  n_recent_B = jnp.sum(recent_key_BxN > -jnp.inf, axis=1)
  recent_BxQ = recent_order_BxN[:, :q] if n >= q else jnp.pad(
      recent_order_BxN, ((0, 0), (0, q - n)), constant_values=-1)

  below = lambda k_B: r_Q[None, :] < k_B[:, None]
  is_recent = below(jnp.minimum(t_B, n_recent_B))
  is_draft = ~below(t_B) & below(t_B + s_B)
  is_mask = ~below(t_B + s_B) & below(t_B + 2 * s_B)
  is_pred = ~below(t_B + 2 * s_B) & below(t_B + 2 * s_B + p_B)
  # candidates with a predictor row, in order (the first P_B entries)
  pred_cand_BxC = jnp.argsort(~need_BxC, axis=1, stable=True)
  pred_rank_BxQ = jnp.take_along_axis(
      pred_cand_BxC, jnp.clip(r_Q - (t_B + 2 * s_B)[:, None], 0, c - 1), 1)
  rank_BxQ = jnp.where(is_draft, r_Q - t_B[:, None], jnp.where(
      is_mask, r_Q - t_B[:, None] - s_B[:, None], pred_rank_BxQ))
  rank_BxQ = jnp.clip(rank_BxQ, 0, c - 1)
  kind_BxQ = jnp.where(is_recent, RECENT, jnp.where(
      is_draft, DRAFT, jnp.where(is_mask, MASK, jnp.where(
          is_pred, PREDICT, UNUSED))))
  cand_slot_BxQ = jnp.take_along_axis(cand_slots_BxC, rank_BxQ, axis=1)
  slots_BxQ = jnp.where(is_recent, recent_BxQ, jnp.where(
      is_draft | is_mask, cand_slot_BxQ,
      jnp.where(is_pred, cand_slot_BxQ - 1, -1)))
  recent_tok_BxQ = jnp.take_along_axis(tokens_BxN, jnp.maximum(recent_BxQ, 0),
                                       1)
  draft_tok_BxQ = jnp.take_along_axis(drafts_BxC, rank_BxQ, axis=1)
  pred_tok_BxQ = jnp.take_along_axis(
      _predictor_tokens(tokens_BxN, cand_slots_BxC, drafts_BxC, real_BxC),
      rank_BxQ, axis=1)
  tokens_BxQ = jnp.where(is_recent, recent_tok_BxQ, jnp.where(
      is_draft, draft_tok_BxQ, jnp.where(is_pred, pred_tok_BxQ, mask_id)))

  row_k, col_k = kind_BxQ[:, :, None], kind_BxQ[:, None, :]
  row_k = jnp.where(row_k == PREDICT, MASK, row_k)  # mask view i's visibility
  row_i, col_j = rank_BxQ[:, :, None], rank_BxQ[:, None, :]
  sees = (col_k == RECENT) | (
      (row_k == RECENT) & (col_k == MASK)) | (
      (row_k == DRAFT) & (((col_k == DRAFT) & (col_j <= row_i))
                          | ((col_k == MASK) & (col_j > row_i)))) | (
      (row_k == MASK) & (((col_k == DRAFT) & (col_j < row_i))
                         | ((col_k == MASK) & (col_j >= row_i))))
  inq_BxQxQ = sees & (row_k != UNUSED) & (col_k != UNUSED) & (
      col_k != PREDICT)
  hidden_BxQ = jnp.where((slots_BxQ >= 0) & ~is_pred, slots_BxQ, n)
  exclude_BxS = jnp.zeros((b, n), bool).at[
      jnp.arange(b)[:, None], hidden_BxQ].set(True, mode="drop")
  mask_rows_BxC = jnp.where(real_BxC, (t_B + s_B)[:, None] + i_C[None, :], 0)
  pred_rows_BxC = (t_B + 2 * s_B)[:, None] + jnp.cumsum(need_BxC, 1) - 1
  score_rows_BxC = jnp.where(need_BxC, pred_rows_BxC, jnp.where(
      reuse_BxC, t_B[:, None] + i_C[None, :] - 1, mask_rows_BxC))
  return VerifyPlan(slots_BxQ, tokens_BxQ, kind_BxQ, rank_BxQ, inq_BxQxQ,
                    exclude_BxS, mask_rows_BxC, score_rows_BxC, s_B)


def _predictor_tokens(tokens_BxN, cand_slots_BxC, drafts_BxC, real_BxC):
  """[B, C]: the token at c_i - 1 in candidate i's mask view."""
  i_C = jnp.arange(cand_slots_BxC.shape[1])
  prev_BxC = jnp.maximum(cand_slots_BxC - 1, 0)
  # is_k_BxCxC[b, i, k]: c_i - 1 is the earlier candidate k
  is_k_BxCxC = (cand_slots_BxC[:, None, :] == prev_BxC[:, :, None]) & (
      real_BxC[:, None, :]) & (i_C[None, None, :] < i_C[None, :, None])
  draft_BxC = jnp.take_along_axis(drafts_BxC, jnp.argmax(is_k_BxCxC, 2), 1)
  return jnp.where(is_k_BxCxC.any(2), draft_BxC,
                   jnp.take_along_axis(tokens_BxN, prev_BxC, 1))


def accept(p_BxC: jax.Array, s_B: jax.Array, gamma) -> jax.Array:
  """[B, C] bool: the longest prefix (i < S) with prod_{j<=i} p_j >= gamma
  (a number, or [B]: a level per row)."""
  c = p_BxC.shape[1]
  real_BxC = jnp.arange(c)[None, :] < s_B[:, None]
  cum_BxC = jnp.cumprod(jnp.where(real_BxC, p_BxC, 1.0), axis=1)
  return real_BxC & (cum_BxC >= jnp.reshape(gamma, (-1, 1)))


class Verified(NamedTuple):
  """One verify pass: plan, probabilities p_BxC, accepted keep_BxC, and the
  candidates' slots_BxC (-1 = none) and drafts_BxC, in confidence order."""

  plan: VerifyPlan
  p_BxC: jax.Array
  keep_BxC: jax.Array
  slots_BxC: jax.Array
  drafts_BxC: jax.Array
  top: tuple | None = None  # (lp_BxCxK, id_BxCxK) with run_pass's top_k


def candidates(window_BxW, drafts_BxW, conf_BxW, eligible_BxW, c: int):
  """The c most confident eligible drafts, most confident first: (their
  indices into W [B, C], slots [B, C] (-1 = none), drafts [B, C], count
  [B])."""
  order_BxC = jnp.argsort(jnp.where(eligible_BxW, -conf_BxW, jnp.inf),
                          axis=1, stable=True)[:, :c]
  n_cand_B = jnp.minimum(eligible_BxW.sum(1), c)
  real_BxC = jnp.arange(c)[None, :] < n_cand_B[:, None]
  slots_BxC = jnp.where(
      real_BxC, jnp.take_along_axis(window_BxW, order_BxC, 1), -1)
  drafts_BxC = jnp.take_along_axis(drafts_BxW, order_BxC, 1)
  return order_BxC, slots_BxC, drafts_BxC, n_cand_B


def run_pass(model, the_plan: VerifyPlan, cache, drafts_BxC,
             hidden_BxS, top_k: int = 0):
  """p [B, C]: each candidate draft's probability from the verify pass over
  the plan's rows (no cache write; hidden_BxS slots unseen), skipped when no
  row has a candidate. top_k > 0: (p, (lp_BxCxK, id_BxCxK)), the pass's
  top_k alternatives of each candidate (top_logprobs.of_logits)."""
  def run():
    out = model.run(the_plan.tokens_BxQ, the_plan.slots_BxQ, cache,
                    the_plan.score_rows_BxC, extras=CachedExtras(
                        write_cache=False, exclude_BxS=hidden_BxS,
                        inq_mask_BxQxQ=the_plan.inq_BxQxQ))
    p_BxC = select.prob_of(out.logits, drafts_BxC)
    if not top_k:
      return p_BxC
    return p_BxC, top_logprobs.of_logits(out.logits, top_k)

  def skip():
    p_BxC = jnp.zeros(drafts_BxC.shape, jnp.float32)
    if not top_k:
      return p_BxC
    shape = drafts_BxC.shape + (top_k,)
    return p_BxC, (jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32))

  return jax.lax.cond(jnp.any(the_plan.S_B > 0), run, skip)


def verify(model, tokens_BxN, recent_key_BxN, window_BxW, drafts_BxW,
           conf_BxW, eligible_BxW, end_B, cache, *, block_m: int,
           gamma, accept_none: bool = False,
           exclude_BxS=None, top_k: int = 0) -> Verified:
  """Picks the candidates (the block_m // 2 most confident eligible window
  drafts), runs the pass over the recent tokens (recent_key_BxN, larger =
  more recent) and applies the acceptance rule; probabilities of candidates
  at or past the answer end (end_B) are 0, as in the reference.
  accept_none: run the pass, keep nothing (the benchmark schedule).
  exclude_BxS: further slots hidden from the pass (the tail past its keys).
  top_k > 0: the candidates' alternatives too (Verified.top)."""
  cfg = model.config
  _, cand_slots_BxC, cand_drafts_BxC, n_cand_B = candidates(
      window_BxW, drafts_BxW, conf_BxW, eligible_BxW, block_m // 2)
  the_plan = plan(tokens_BxN, recent_key_BxN, cand_slots_BxC, cand_drafts_BxC,
                  n_cand_B, block_m, cfg.mask_token_id, cfg.logits_shift)
  hidden_BxS = the_plan.exclude_BxS
  if exclude_BxS is not None:
    hidden_BxS = hidden_BxS | exclude_BxS
  p_BxC = run_pass(model, the_plan, cache, cand_drafts_BxC, hidden_BxS,
                   top_k)
  top = None
  if top_k:
    p_BxC, top = p_BxC
  p_BxC = jnp.where(cand_slots_BxC >= end_B[:, None], 0.0, p_BxC)
  keep_BxC = accept(p_BxC, the_plan.S_B, gamma)
  if accept_none:
    # Never true (probabilities are >= 0) but data-dependent, so XLA cannot
    # drop the pass as dead code and the benchmark times it.
    keep_BxC = keep_BxC & (p_BxC < 0)
  return Verified(the_plan, p_BxC, keep_BxC, cand_slots_BxC, cand_drafts_BxC,
                  top)
