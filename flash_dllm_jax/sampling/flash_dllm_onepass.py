"""Flash-dLLM with one weight read per step: step t's Flash-Verify pass rides
in step t + 1's Flash-Cache forward.

Flash-dLLM runs two model calls a step: the Flash-Cache forward that drafts
the window, then the verify pass over up to block_m // 2 of its drafts. Here
the verify rows of step t's drafts (flash_verify.plan without recent rows:
a draft and a mask row per candidate, Dream's predictor rows) join step
t + 1's forward as CachedExtras side rows, so one read of the weights serves
both. Per row, step t + 1:

  1. One forward. The budget rows (window, extra masks, tracked positions)
     write the cache as in Flash-dLLM; the window and extra masks are taken
     past the pending drafts (which still hold [MASK]; skip_drafts), unless
     those are all the row has left, so the window decodes new positions
     while the drafts are verified. The side rows write nothing and see that freshly
     written cache minus the candidates' slots, plus each other as in
     Flash-Verify (draft row i: drafts j <= i, masks j > i; mask row i:
     drafts j < i, masks j >= i). The budget's tracked rows re-encode the
     last step's commits, which is what Flash-Verify's recent rows are for.
  2. Verify: p_i = the mask view's probability of draft i (0 at or past the
     answer's end); accepted: the longest prefix with
     prod_{j<=i} p_j >= gamma (flash_verify.accept; nothing under "fixed").
  3. Commit: the accepted drafts, then the window's commit rule over the
     window positions not accepted (their tokens from this step's budget
     rows, which did not see the accepted drafts: tokens committed in one
     step are decoded in parallel, as in every threshold step). A step
     commits at least one token: the rule commits one unless every window
     position was accepted.
  4. Draft: the block_m // 2 most confident window positions left open
     before the answer's end are the next step's candidates.

Budget rows never see a draft, so no committed token depends on a rejected
one. The answer's end, budget, tracked list (the step's commits, accepted
ones included, are its last batch) and EOS tail follow flash_dllm.py.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling import commit_rules, flash_budget, flash_verify
from flash_dllm_jax.sampling import select
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.flash_state import FlashCacheAux, StepTrace
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@struct.dataclass
class OnePassAux(FlashCacheAux):
  """FlashCacheAux plus the drafts the next step verifies: their slots
  cand_BxC (-1 = none) in draft-confidence order and tokens draft_BxC."""

  cand_BxC: jax.Array
  draft_BxC: jax.Array


@dataclasses.dataclass(frozen=True)
class FlashDLLMOnePassSampler(FlashDLLMSampler):
  """Flash-dLLM in one forward a step (module docstring). Fields as
  FlashDLLMSampler's; verify is always on (gamma: the acceptance level)
  and recompute_all is not taken. skip_drafts: the window and extra masks
  are taken past the drafts being verified (False: the window holds them
  again, re-drafted beside their verification)."""

  records_top: ClassVar[bool] = False  # its steps return no alternatives

  verify: bool = option(True, "always on: the verify rows ride in the "
                        "next step's forward")
  skip_drafts: bool = option(True, "take the window and extra masks past "
                             "the drafts being verified (off: re-draft them "
                             "beside their verification)")

  def _joint_errors(self) -> list[str]:
    errors = super()._joint_errors()
    if not self.verify or self.recompute_all:
      errors.append("one-pass always verifies (verify=True) and reads the "
                    "cache (recompute_all=False)")
    return errors

  @property
  def candidates(self) -> int:
    return self.block_m // 2

  def side_rows(self, shift: int) -> int:
    """Verify rows a sequence adds to the forward: a draft and a mask row
    per candidate, and a predictor row each for Dream (shift 1)."""
    return (2 + shift) * self.candidates

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    base = super().init_aux(model, tokens_BxN)
    none_BxC = jnp.full((tokens_BxN.shape[0], self.candidates), -1,
                        jnp.int32)
    return OnePassAux(**vars(base), cand_BxC=none_BxC, draft_BxC=none_BxC)

  def reset_rows(self, aux: OnePassAux, rows_B: jax.Array) -> OnePassAux:
    aux = super().reset_rows(aux, rows_B)
    return aux.replace(cand_BxC=jnp.where(rows_B[:, None], -1, aux.cand_BxC))

  def step_trace(self, model: SequenceModel, state: DecodeState,
                 prompt_len: int,
                 rng_B: jax.Array | None = None) -> StepTrace:
    """One step; the trace's plan, p_BxC and keep_BxC are the side rows'
    plan and the previous drafts' probabilities and acceptance."""
    aux = state.aux
    b, n = state.tokens_BxN.shape
    w, c = self.block_m, self.candidates
    cfg = model.config
    rows_Bx1 = jnp.arange(b)[:, None]
    end_B = aux.end_B

    # 1. the previous drafts still open before the end, as side rows
    undecoded_BxN = self._regions(model, state.tokens_BxN, prompt_len, aux,
                                  aux.fresh_B).undecoded_BxN
    open_BxC = (aux.cand_BxC >= 0) & (aux.cand_BxC < end_B[:, None]) & (
        jnp.take_along_axis(undecoded_BxN, jnp.maximum(aux.cand_BxC, 0), 1))
    order_BxC = jnp.argsort(~open_BxC, axis=1, stable=True)  # keep order
    cand_BxC = jnp.where(jnp.take_along_axis(open_BxC, order_BxC, 1),
                         jnp.take_along_axis(aux.cand_BxC, order_BxC, 1), -1)
    draft_BxC = jnp.take_along_axis(aux.draft_BxC, order_BxC, 1)
    side = flash_verify.plan(
        state.tokens_BxN, None, cand_BxC, draft_BxC, open_BxC.sum(1), w,
        cfg.mask_token_id, cfg.logits_shift,
        rows=self.side_rows(cfg.logits_shift))
    # The window moves past the drafts being verified, unless they are all
    # the row has left (a step then commits at least one token).
    pending_BxN = jnp.zeros((b, n), bool).at[
        rows_Bx1, jnp.where(cand_BxC >= 0, cand_BxC, n)].set(True, mode="drop")
    rest_B = jnp.any(undecoded_BxN & ~pending_BxN, axis=1) & self.skip_drafts
    (r, slots_BxQ, logits_BxRxV, cache, rank_BxN,
     side_BxCxV) = self.budget_pass(model, state, prompt_len, side=side,
                                    skip_BxN=pending_BxN & rest_B[:, None])
    tokens_BxN = r.tokens_BxN

    # 2. verify
    real_BxC = cand_BxC >= 0
    p_BxC = jnp.where(real_BxC, select.prob_of(
        side_BxCxV, jnp.maximum(draft_BxC, 0)), 0.0)
    keep_BxC = flash_verify.accept(
        p_BxC, side.S_B, commit_rules.row_value(state, "gamma", self.gamma))
    if self.rule == "fixed":
      keep_BxC = keep_BxC & (p_BxC < 0)  # the schedule accepts nothing
    kept_BxC = jnp.where(keep_BxC, cand_BxC, n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, kept_BxC].set(
        draft_BxC.astype(tokens_BxN.dtype), mode="drop")
    logprob_BxN = jnp.zeros((b, n), jnp.float32).at[rows_Bx1, kept_BxC].set(
        jnp.log(p_BxC), mode="drop")
    ids = flash_budget.end_tokens(model, self.end_rule)
    end_B = flash_budget.update_end(end_B, n, cand_BxC, draft_BxC, keep_BxC,
                                    ids, self.end_rule)

    # 3. commit the window's rule over the positions not accepted
    scored_BxR = slots_BxQ[:, :self._scored]
    x0_BxR, conf_BxR, lp_BxR = commit_rules.proposal(
        logits_BxRxV, state, rng_B, cfg.mask_token_id)
    window_BxW = scored_BxR[:, :w]
    accepted_BxW = jnp.any(
        (window_BxW[:, :, None] == cand_BxC[:, None, :]) & keep_BxC[:, None],
        axis=2)
    real_BxW = (window_BxW >= 0) & ~accepted_BxW
    drafts_BxW = x0_BxR[:, :w].astype(tokens_BxN.dtype)
    conf_w_BxW = self.window_confidence(window_BxW, drafts_BxW,
                                        conf_BxR[:, :w], real_BxW, end_B,
                                        ids, n)
    commit_BxW = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_w_BxW, real_BxW, state.steps_B) & real_BxW
    commit_slots_BxW = jnp.where(commit_BxW, window_BxW, n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, commit_slots_BxW].set(
        drafts_BxW, mode="drop")
    logprob_BxN = logprob_BxN.at[rows_Bx1, commit_slots_BxW].set(
        lp_BxR[:, :w], mode="drop")
    new_end_B = flash_budget.update_end(end_B, n, window_BxW, drafts_BxW,
                                        commit_BxW, ids, self.end_rule)
    last_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, commit_slots_BxW].set(
        True, mode="drop").at[rows_Bx1, kept_BxC].set(True, mode="drop")

    # 4. the next step's candidates
    eligible_BxW = real_BxW & ~commit_BxW & (window_BxW < new_end_B[:, None])
    _, next_BxC, next_drafts_BxC, _ = flash_verify.candidates(
        window_BxW, drafts_BxW, conf_w_BxW, eligible_BxW, c)

    conf_BxN = flash_budget.record_confidence(aux.conf_BxN, scored_BxR,
                                              conf_BxR)
    tail_BxN = jnp.arange(n)[None, :] >= r.gen_end
    aux = OnePassAux(cache=cache, rank_BxN=rank_BxN, last_BxN=last_BxN,
                     conf_BxN=conf_BxN, end_B=new_end_B,
                     tail_done_BxN=aux.tail_done_BxN | (tail_BxN & last_BxN),
                     fresh_B=jnp.zeros_like(aux.fresh_B),
                     cand_BxC=next_BxC.astype(jnp.int32),
                     draft_BxC=next_drafts_BxC.astype(jnp.int32))
    return StepTrace(tokens_BxN, aux, jnp.ones((b,), jnp.int32), side, p_BxC,
                     keep_BxC, logprob_BxN)
