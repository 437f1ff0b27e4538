"""Flash-dLLM with one weight read per step: the verify pass folded into the
next step's forward.

Flash-dLLM's verify pass is a second model call each step. Here a step runs
the Flash-Cache forward alone (flash_dllm.budget_pass), and its logits both
check the previous step's drafts and decode the window. Per row, step t:

  1. Forward over the budget (window, extra masks, tracked positions) with
     the sequence as committed: every draft position still holds [MASK].
  2. Verify: the previous step's drafts d_0, d_1, ... (its block_m // 2
     most confident uncommitted window positions before the answer's end,
     most confident first) that lie in this step's window before the end;
     p_i = this step's probability of token d_i at its position; accepted:
     the longest prefix with prod_{j<=i} p_j >= gamma (flash_verify.accept,
     Flash-Verify's rule; nothing under rule="fixed").
  3. Commit: the accepted drafts (their tokens), and the window's commit
     rule (threshold, at least one) over the window positions not accepted,
     with this step's tokens. A step commits at least one token: the rule
     commits one unless every window position was accepted.
  4. Draft: the block_m // 2 most confident window positions left
     uncommitted before the end, with this step's tokens, are the next
     step's drafts.

Why it is sound: no forward ever sees a draft (drafts are never written to
the sequence or the cache), so no committed token depends on a draft that
was rejected, nor on an accepted one of its own step; an accepted draft is
a token the model predicted at step t - 1 and still gives probability
(cumulatively) >= gamma at step t, given everything committed through step
t - 1. Tokens committed in one step are decoded in parallel (none
conditions on another), as in every threshold step. The answer's end, the
budget, the tracked list (the step's commits are its last batch) and the
EOS tail follow flash_dllm.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling import commit_rules, flash_budget, flash_verify
from flash_dllm_jax.sampling import select
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.flash_state import FlashCacheAux, StepTrace
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

NO_DRAFT = -1


@struct.dataclass
class OneReadAux(FlashCacheAux):
  """FlashCacheAux plus the previous step's drafts: draft_BxN the token
  drafted at each position (NO_DRAFT: none), order_BxN its rank in
  draft-confidence order (0 = most confident)."""

  draft_BxN: jax.Array
  order_BxN: jax.Array


@dataclasses.dataclass(frozen=True)
class FlashDLLMOneReadSampler(FlashDLLMSampler):
  """Flash-dLLM whose step is one forward (module docstring). Fields as
  FlashDLLMSampler's; verify is always on (gamma: the acceptance level)
  and recompute_all is not taken."""

  verify: bool = True

  def __post_init__(self):
    super().__post_init__()
    if not self.verify or self.recompute_all:
      raise ValueError("invalid Flash-dLLM one-read arguments: it always "
                       "verifies (verify=True) and reads the cache "
                       "(recompute_all=False)")

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    base = super().init_aux(model, tokens_BxN)
    none_BxN = jnp.full(tokens_BxN.shape, NO_DRAFT, jnp.int32)
    return OneReadAux(**vars(base), draft_BxN=none_BxN, order_BxN=none_BxN)

  def reset_rows(self, aux: OneReadAux, rows_B: jax.Array) -> OneReadAux:
    aux = super().reset_rows(aux, rows_B)
    return aux.replace(draft_BxN=jnp.where(rows_B[:, None], NO_DRAFT,
                                           aux.draft_BxN))

  def step_trace(self, model: SequenceModel, state: DecodeState,
                 prompt_len: int,
                 rng_B: jax.Array | None = None) -> StepTrace:
    """One step; the trace's plan is None, p_BxC / keep_BxC are the
    previous drafts' probabilities and acceptance (draft-confidence
    order)."""
    aux = state.aux
    b, n = state.tokens_BxN.shape
    w, c = self.block_m, self.block_m // 2
    r, slots_BxQ, logits_BxRxV, cache, rank_BxN = self.budget_pass(
        model, state, prompt_len)
    tokens_BxN, end_B = r.tokens_BxN, aux.end_B
    scored_BxR = slots_BxQ[:, :self._scored]
    x0_BxR, conf_BxR, lp_BxR = commit_rules.proposal(
        logits_BxRxV, state, rng_B, model.config.mask_token_id)
    window_BxW = scored_BxR[:, :w]
    real_BxW = window_BxW >= 0
    at_BxW = jnp.maximum(window_BxW, 0)
    open_BxW = real_BxW & (window_BxW < end_B[:, None])
    rows_Bx1 = jnp.arange(b)[:, None]

    # 2. the previous drafts, read from this step's logits
    old_BxW = jnp.take_along_axis(aux.draft_BxN, at_BxW, 1)
    has_BxW = open_BxW & (old_BxW != NO_DRAFT)
    order_BxW = jnp.take_along_axis(aux.order_BxN, at_BxW, 1)
    p_BxW = jnp.where(has_BxW, select.prob_of(
        logits_BxRxV[:, :w], jnp.maximum(old_BxW, 0)), 0.0)
    idx_BxC, _, _, s_B = flash_verify.candidates(
        window_BxW, old_BxW, -order_BxW.astype(jnp.float32), has_BxW, c)
    p_BxC = jnp.where(jnp.arange(c)[None, :] < s_B[:, None],
                      jnp.take_along_axis(p_BxW, idx_BxC, 1), 0.0)
    keep_BxC = flash_verify.accept(
        p_BxC, s_B, commit_rules.row_value(state, "gamma", self.gamma))
    if self.rule == "fixed":
      keep_BxC = keep_BxC & (p_BxC < 0)  # the schedule accepts nothing
    accepted_BxW = jnp.zeros((b, w), bool).at[
        rows_Bx1, jnp.where(keep_BxC, idx_BxC, w)].set(True, mode="drop")

    # 3. commit: accepted drafts, then the rule over the rest of the window
    drafts_BxW = x0_BxR[:, :w].astype(tokens_BxN.dtype)
    ids = flash_budget.end_tokens(model, self.stop)
    conf_w_BxW = jnp.where(open_BxW, conf_BxR[:, :w], 0.0)
    if self.stop == "first":  # nothing after a stop this step predicts
      stop_BxW = flash_budget.is_stop(drafts_BxW, ids) & real_BxW
      first_B = jnp.min(jnp.where(stop_BxW, window_BxW, n), axis=1)
      conf_w_BxW = jnp.where(window_BxW > first_B[:, None], 0.0, conf_w_BxW)
    ruled_BxW = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_w_BxW, real_BxW & ~accepted_BxW, state.steps_B)
    commit_BxW = ruled_BxW | accepted_BxW
    new_BxW = jnp.where(accepted_BxW, old_BxW.astype(tokens_BxN.dtype),
                        drafts_BxW)
    lp_BxW = jnp.where(accepted_BxW, jnp.log(p_BxW), lp_BxR[:, :w])
    commit_slots_BxW = jnp.where(commit_BxW, window_BxW, n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, commit_slots_BxW].set(
        new_BxW, mode="drop")
    logprob_BxN = jnp.zeros((b, n), jnp.float32).at[
        rows_Bx1, commit_slots_BxW].set(lp_BxW, mode="drop")
    new_end_B = flash_budget.update_end(end_B, n, window_BxW, new_BxW,
                                        commit_BxW, ids, self.stop)
    last_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, commit_slots_BxW].set(
        True, mode="drop")

    # 4. the next step's drafts
    eligible_BxW = open_BxW & ~commit_BxW
    _, next_BxC, next_drafts_BxC, _ = flash_verify.candidates(
        window_BxW, drafts_BxW, conf_w_BxW, eligible_BxW, c)
    next_at_BxC = jnp.where(next_BxC >= 0, next_BxC, n)
    none_BxN = jnp.full((b, n), NO_DRAFT, jnp.int32)
    draft_BxN = none_BxN.at[rows_Bx1, next_at_BxC].set(
        next_drafts_BxC.astype(jnp.int32), mode="drop")
    order_BxN = none_BxN.at[rows_Bx1, next_at_BxC].set(
        jnp.broadcast_to(jnp.arange(c, dtype=jnp.int32), (b, c)),
        mode="drop")

    conf_BxN = flash_budget.record_confidence(aux.conf_BxN, scored_BxR,
                                              conf_BxR)
    tail_BxN = jnp.arange(n)[None, :] >= r.gen_end
    aux = OneReadAux(cache=cache, rank_BxN=rank_BxN, last_BxN=last_BxN,
                     conf_BxN=conf_BxN, end_B=new_end_B,
                     tail_done_BxN=aux.tail_done_BxN | (tail_BxN & last_BxN),
                     fresh_B=jnp.zeros_like(aux.fresh_B),
                     draft_BxN=draft_BxN, order_BxN=order_BxN)
    return StepTrace(tokens_BxN, aux, jnp.ones((b,), jnp.int32), None, p_BxC,
                     keep_BxC, logprob_BxN)
