"""Flash-dLLM: Flash-Cache, optionally with Flash-Verify (VILA-Lab/Flash-dLLM).

Every step pushes a fixed budget of query positions per row through the whole
model against a KV cache that covers the full sequence (flash_budget.py):
the block_m-position window to decode, (mask_num - 1) * block_m further masks
to refresh, and track_num * block_m tracked decoded positions. Their fresh
K/V overwrite their slots; everything else is read from the cache. A row's
first step runs every position (a prefill) so its cache starts complete.
The window is decoded by its commit rule (commit_rules.py; the reference's
is the confidence threshold, at least one commit per step). The first commit batch holding EOS fixes the answer's end after the
largest such position; nothing at or after the end is decoded, and a row is
finished once no mask remains before it. With `verify`, a second pass checks
up to block_m // 2 of the remaining window drafts (flash_verify.py, which
also defines the pass for Dream). The defaults are the reference's rules;
`window_rule`, `end_rule` and `rank` name the project's alternatives.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar
import jax
import jax.numpy as jnp

from flash_dllm_jax.sampling import (checks, commit_rules, flash_budget,
                                     flash_forward, flash_verify, options,
                                     top_logprobs)
from flash_dllm_jax.model.cache import KV_CACHE_DTYPES
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.flash_state import FlashCacheAux, StepTrace
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

NOT_SCORED = flash_budget.NOT_SCORED


@dataclasses.dataclass(frozen=True)
class FlashDLLMSampler(commit_rules.WindowRule):
  """Flash-Cache decoding; defaults follow the reference (VILA-Lab
  Flash-dLLM `generate_with_Flash_dLLM` and its GSM8K script).

  window_rule / end_rule / rank: the reference's rules by default; the
    others are the project's (flash_budget.py): window_rule "confident",
    end_rule "first" (the first committed EOS or EOT ends the answer), rank "mass" (softmax
    attention mass instead of summed q.k ranks the decoded positions).
  rank_from_layer: layers from this one on add to the rank (the reference's
    `block_idx > 1`).
  eos_tail: lay the sequence out as the reference does, EOS tokens after
    the generation up to its 128-key tiles (flash_budget.regions), to
    reproduce its decodes; not the default, as it changes answers.
  recompute_all: run every position uncached each step instead (the
    exactness reference: with a budget covering the whole sequence the cached
    run must equal it).
  verify / gamma: Flash-Verify and its acceptance level (0.8 for GSM8K and
    MBPP in the reference scripts, 0.85 for MATH and HumanEval); a row's
    own gamma and threshold are row data (row_options.py).
  rule / threshold / steps: the window's commit rule (commit_rules.py):
    "threshold" (the reference's), or "fixed", LLaDA's even schedule of
    `steps` steps (default gen_length): exactly gen_length / steps window
    positions a step, most confident first, whatever their confidence, with
    the verify pass accepting nothing, so step counts do not depend on the
    (random) weights: the benchmarks' schedule.
  max_refills: under continuous batching, at most this many slots take a new
    request per loop step (None: any number). The server admits every free
    slot at once (`grows_refills`). Fresh rows (every row at the first
    step) prefill max_refills at a time (None: all together) and the rows
    left over one at a time, so the prefill's memory beside the cache is
    one group's (flash_forward.prefill_rows).
  kv_cache_dtype: the KV cache's storage, "auto" (the model's dtype) or an
    8-bit format, "float8_e4m3fn" or "int8", with a bfloat16 scale per
    (row, slot, KV head): half the cache's memory; the attention kernel
    reads the 8-bit cache and dequantizes per tile (docs/kv_cache.md).
  """

  row_fields: ClassVar[tuple[str, ...]] = (  # DecodeState.sampling
      "temperature", "top_p", "top_k", "threshold", "gamma")
  grows_refills: ClassVar[bool] = True  # any number of fresh rows a step
  records_top: ClassVar[bool] = True  # loop.records_top (top_logprobs.py)

  gen_length: int = option(256, "answer tokens decoded", ge=1)
  block_m: int = option(16, "positions of the decode window (the budget's "
                        "unit)", ge=1)
  track_num: int = option(4, "decoded positions refreshed a step, in units "
                          "of block_m", ge=0)
  mask_num: int = option(4, "masks refreshed a step, in units of block_m "
                         "(the window included)", ge=1)
  rule: str = option("threshold", "the window's commit rule: confidence "
                     "threshold, or a fixed schedule of steps",
                     choices=commit_rules.WINDOW_RULES)
  threshold: float = option(0.9, "confidence a mask needs to commit (the "
                            "most confident always does)", gt=0, le=1,
                            needs={"rule": ("threshold",)})
  steps: int | None = option(None, "model steps of the fixed schedule (at "
                             "most gen_length)", ge=1, none="gen_length",
                             needs={"rule": ("fixed",)})
  rank_from_layer: int = option(2, "layers from this one on rank the "
                                "decoded positions to refresh", ge=0)
  verify: bool = option(False, "Flash-Verify the window's remaining drafts")
  gamma: float = option(0.8, "Flash-Verify's acceptance level",
                        gt=0, le=1, needs={"verify": (True,)})
  eos_tail: bool = option(False, "lay out EOS tokens after the answer as "
                          "the reference does (reproduces its decodes)")
  window_rule: str = option("leftmost", "which masks form the window: the "
                            "leftmost, or the most confident open ones",
                            choices=flash_budget.WINDOWS)
  end_rule: str = option("eos", "where the answer ends: eos (after the "
                         "largest EOS of the first commit batch holding one, "
                         "the reference) or first (the first committed EOS "
                         "or EOT)", choices=flash_budget.STOPS)
  rank: str = option("score", "how decoded positions are ranked for a "
                     "refresh: summed q.k scores, or softmax attention mass",
                     choices=("score", "mass"))
  recompute_all: bool = option(False, "run every position uncached each "
                               "step (the exactness reference)")
  max_refills: int | None = max_refills(
      4, ", and fresh rows prefilled together")
  kv_cache_dtype: str = option(
      "auto", "the KV cache's storage: auto (the model's dtype) or an 8-bit "
      "format with a scale per position and KV head, read by the attention "
      "kernel", choices=KV_CACHE_DTYPES)

  def __post_init__(self):
    options.check(self, self._joint_errors)

  def _joint_errors(self) -> list[str]:
    errors = commit_rules.window_errors(self, ("block_m", self.block_m))
    if self.verify and self.recompute_all:
      errors.append("recompute_all (the uncached exactness reference) cannot "
                    "be combined with verify, which reads the cache")
    if self.verify and self.block_m < 2:
      errors.append("verify needs block_m >= 2 (it checks block_m // 2 "
                    "candidates)")
    return errors

  @property
  def num_steps(self) -> int:
    return self.gen_length + self.tail_length  # a commit per step at least

  @property
  def tail_length(self) -> int:
    """Positions kept after the generation (the EOS tail's longest)."""
    return flash_budget.TAIL_KEYS + self.block_m if self.eos_tail else 0

  @property
  def extra_masks(self) -> int:
    return (self.mask_num - 1) * self.block_m

  @property
  def query_budget(self) -> int:
    return self.block_m * (1 + self.track_num) + self.extra_masks

  @property
  def _scored(self) -> int:
    """Query rows whose logits are read: the window, plus the extra masks'
    for the "confident" window (it ranks masks by their last confidence)."""
    return self.block_m + (self.extra_masks if self.window_rule == "confident"
                           else 0)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length + self.tail_length,
                      max_seq_len)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    return FlashCacheAux.start(model.empty_cache(self.kv_cache_dtype),
                               *tokens_BxN.shape)

  def reset_rows(self, aux: FlashCacheAux, rows_B: jax.Array) -> FlashCacheAux:
    """Forgets the rows' bookkeeping when a new request takes their slot; the
    cache needs no reset since their next step (a prefill) rewrites it."""
    b, n = aux.rank_BxN.shape
    r_Bx1 = rows_B[:, None]
    return aux.replace(
        rank_BxN=jnp.where(r_Bx1, flash_budget.initial_rank(b, n),
                           aux.rank_BxN),
        last_BxN=aux.last_BxN & ~r_Bx1,
        conf_BxN=jnp.where(r_Bx1, NOT_SCORED, aux.conf_BxN),
        end_B=jnp.where(rows_B, n + 1, aux.end_B),
        tail_done_BxN=aux.tail_done_BxN & ~r_Bx1,
        fresh_B=aux.fresh_B | rows_B)

  def _regions(self, model, tokens_BxN, prompt_len, aux, fresh_B):
    return flash_budget.regions(model, tokens_BxN, prompt_len,
                                self.gen_length, self.block_m, self.eos_tail,
                                aux.tail_done_BxN, fresh_B)

  def finished(self, model: SequenceModel, tokens_BxN: jax.Array,
               aux: FlashCacheAux, prompt_len: int) -> jax.Array:
    """[B] bool: nothing before the answer's end is undecoded."""
    n = tokens_BxN.shape[1]
    r = self._regions(model, tokens_BxN, prompt_len, aux,
                      jnp.zeros_like(aux.fresh_B))
    end_B = flash_budget.effective_end(aux.end_B, n, r.gen_end)
    return ~jnp.any(r.undecoded_BxN & (jnp.arange(n)[None, :]
                                       < end_B[:, None]), 1)

  # One step ------------------------------------------------------------------
  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    trace = self.step_trace(model, state, prompt_len, rng_B)
    return (trace.tokens_BxN, trace.aux, trace.forwards_B, trace.logprob_BxN,
            trace.top)

  def step_trace(self, model: SequenceModel, state: DecodeState,
                 prompt_len: int,
                 rng_B: jax.Array | None = None) -> "StepTrace":
    """One step, with the verify pass's plan and probabilities exposed so
    tests can check them against an independent forward."""
    aux = state.aux
    b, n = state.tokens_BxN.shape
    w = self.block_m
    r, slots_BxQ, logits_BxRxV, cache, rank_BxN = self.budget_pass(
        model, state, prompt_len)
    tokens_BxN, decoded_BxN, exclude_BxS = (r.tokens_BxN, r.decoded_BxN,
                                            r.exclude_BxS)
    end_B = aux.end_B  # N + 1 until an end token commits: no limit
    scored_BxR = slots_BxQ[:, :self._scored]
    x0_BxR, conf_BxR, lp_BxR = commit_rules.proposal(
        logits_BxRxV, state, rng_B, model.config.mask_token_id)
    window_BxW = scored_BxR[:, :w]
    real_BxW = window_BxW >= 0
    drafts_BxW = x0_BxR[:, :w].astype(tokens_BxN.dtype)
    ids = flash_budget.end_tokens(model, self.end_rule)
    conf_w_BxW = self.window_confidence(window_BxW, drafts_BxW,
                                        conf_BxR[:, :w], real_BxW, end_B,
                                        ids, n)
    commit_BxW = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_w_BxW, real_BxW, state.steps_B)
    rows_Bx1 = jnp.arange(b)[:, None]
    commit_slots_BxW = jnp.where(commit_BxW, window_BxW, n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, commit_slots_BxW].set(
        drafts_BxW, mode="drop")
    new_end_B = flash_budget.update_end(aux.end_B, n, window_BxW, drafts_BxW,
                                        commit_BxW, ids, self.end_rule)
    drafted_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, commit_slots_BxW].set(
        True, mode="drop")
    logprob_BxN = jnp.zeros((b, n), jnp.float32).at[
        rows_Bx1, commit_slots_BxW].set(lp_BxR[:, :w], mode="drop")
    k = 0 if state.top is None else state.top.k
    top = None if not k else top_logprobs.put(
        top_logprobs.TopLogprobs.zeros(b, n, k), rows_Bx1, commit_slots_BxW,
        *top_logprobs.of_logits(logits_BxRxV[:, :w], k, x0_BxR[:, :w],
                                lp_BxR[:, :w]))
    last_BxN, forwards_B = drafted_BxN, jnp.ones((b,), jnp.int32)
    plan = p_BxC = keep_BxC = None
    if self.verify:
      eligible_BxW = real_BxW & ~commit_BxW & (window_BxW < end_B[:, None])
      recent_BxN = flash_budget.recent_key(decoded_BxN, drafted_BxN,
                                           aux.rank_BxN, aux.last_BxN)
      v = flash_verify.verify(
          model, tokens_BxN, recent_BxN, window_BxW, drafts_BxW, conf_w_BxW,
          eligible_BxW, new_end_B, cache, block_m=self.block_m,
          gamma=commit_rules.row_value(state, "gamma", self.gamma),
          accept_none=self.rule == "fixed",
          exclude_BxS=exclude_BxS, top_k=k)
      plan, p_BxC, keep_BxC = v.plan, v.p_BxC, v.keep_BxC
      verified_BxC = jnp.where(keep_BxC, v.slots_BxC, n)
      tokens_BxN = tokens_BxN.at[rows_Bx1, verified_BxC].set(
          v.drafts_BxC, mode="drop")
      lp_BxC = jnp.log(p_BxC)  # the verify pass's probability
      logprob_BxN = logprob_BxN.at[rows_Bx1, verified_BxC].set(
          lp_BxC, mode="drop")
      if k:
        top = top_logprobs.put(top, rows_Bx1, verified_BxC,
                               *top_logprobs.with_chosen(
                                   *v.top, v.drafts_BxC, lp_BxC))
      new_end_B = flash_budget.update_end(new_end_B, n, v.slots_BxC,
                                          v.drafts_BxC, keep_BxC, ids,
                                          self.end_rule)
      last_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, verified_BxC].set(
          True, mode="drop")
      forwards_B = forwards_B + (plan.S_B > 0)
    conf_BxN = flash_budget.record_confidence(aux.conf_BxN, scored_BxR,
                                              conf_BxR)
    tail_BxN = jnp.arange(n)[None, :] >= r.gen_end
    aux = FlashCacheAux(cache=cache, rank_BxN=rank_BxN, last_BxN=last_BxN,
                        conf_BxN=conf_BxN, end_B=new_end_B,
                        tail_done_BxN=aux.tail_done_BxN | (
                            tail_BxN & (drafted_BxN | last_BxN)),
                        fresh_B=jnp.zeros_like(aux.fresh_B))
    return StepTrace(tokens_BxN, aux, forwards_B, plan, p_BxC, keep_BxC,
                     logprob_BxN, top)

  def window_confidence(self, window_BxW, drafts_BxW, conf_BxW, real_BxW,
                        end_B, ids, n: int):
    """The window's confidences the commit rule sees: 0 at or past the
    answer's end, and with end_rule "first" past the first stop token this
    step predicts."""
    conf_BxW = jnp.where(window_BxW >= end_B[:, None], 0.0, conf_BxW)
    if self.end_rule == "first":
      stop_BxW = flash_budget.is_stop(drafts_BxW, ids) & real_BxW
      first_B = jnp.min(jnp.where(stop_BxW, window_BxW, n), axis=1)
      conf_BxW = jnp.where(window_BxW > first_B[:, None], 0.0, conf_BxW)
    return conf_BxW

  def budget_pass(self, model: SequenceModel, state: DecodeState,
                  prompt_len: int, side=None, skip_BxN=None):
    """The step's one Flash-Cache forward (flash_forward.budget_pass)."""
    return flash_forward.budget_pass(self, model, state, prompt_len, side,
                                     skip_BxN)
