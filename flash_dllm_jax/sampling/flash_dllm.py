"""Flash-dLLM: Flash-Cache, optionally with Flash-Verify (VILA-Lab/Flash-dLLM).

Every step pushes a fixed budget of query positions per row through the whole
model against a KV cache that covers the full sequence (flash_budget.py):
block_m window masks to decode, (mask_num - 1) * block_m further masks to
refresh, and track_num * block_m tracked positions (new commits first, then
by attention mass). Their fresh K/V overwrite their slots; everything else
is read from the cache. The first step runs every position (a prefill) so
the cache starts complete. The window is decoded with the confidence
threshold (at least one commit per step); masked positions after a committed
stop token are dropped.
With `verify`, a second pass checks up to block_m // 2 of the remaining
window drafts (flash_verify.py, which also defines the pass for Dream).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.model import CachedExtras, KVCache
from flash_dllm_jax.sampling import (checks, flash_budget, flash_verify,
                                     parallel_rules)
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

NOT_SCORED = -1.0  # rank of masked positions that have never been scored


@struct.dataclass
class FlashCacheAux:
  """Per-row bookkeeping carried through the loop.

  cache: KV of every slot. rank_BxN: last confidence of each masked position
  (NOT_SCORED if never scored). mass_BxN: attention mass each slot drew from
  the window in the last step. new_BxN: positions committed in the last step.
  committed_at_BxN: the step each generated position was committed (-1 for
  the prompt and for masks), which orders the verify pass's recent tokens.
  fresh_B: rows whose next step is a prefill (a new request in the slot).
  """

  cache: KVCache
  rank_BxN: jax.Array
  mass_BxN: jax.Array
  new_BxN: jax.Array
  committed_at_BxN: jax.Array
  fresh_B: jax.Array


@dataclasses.dataclass(frozen=True)
class FlashDLLMSampler:
  """Flash-Cache decoding; defaults follow the reference GSM8K script.

  recompute_all: run every position uncached each step instead (the
  exactness reference: with a budget covering the whole sequence the cached
  run must equal it).
  verify / gamma: Flash-Verify and its acceptance level (0.8 for GSM8K and
  MBPP in the reference scripts, 0.85 for MATH and HumanEval).
  forced_commits: benchmark schedule: commit exactly this many window
    positions per step (most confident first) whatever their confidence, and
    run the verify pass without accepting anything, so step counts do not
    depend on (random) weights.
  max_refills: under continuous batching, at most this many slots take a new
    request per loop step, and such a step prefills those rows alone (None:
    any number, and a step with new requests prefills every row). Default 4:
    on an H200 (32 slots) it gave 1.09-1.21x the tokens/s of static batches
    where None gave 0.81-0.92x (BENCHMARKS.md, "Continuous batching").
  """

  gen_length: int = 256
  block_m: int = 16
  track_num: int = 4
  mask_num: int = 4
  threshold: float = 0.9
  mass_from_layer: int = 2
  verify: bool = False
  gamma: float = 0.8
  recompute_all: bool = False
  forced_commits: int | None = None
  max_refills: int | None = 4

  def __post_init__(self):
    checks.check_finite(self)
    errors = []
    for name in ("gen_length", "block_m", "track_num", "mask_num"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < (0 if name == "track_num" else 1):
        errors.append(f"{name} must be a positive int, got {value!r}")
    if not 0 < self.threshold <= 1:
      errors.append(f"threshold must be in (0, 1], got {self.threshold}")
    if not 0 < self.gamma <= 1:
      errors.append(f"gamma must be in (0, 1], got {self.gamma}")
    if self.verify and self.recompute_all:
      errors.append("recompute_all (the uncached exactness reference) cannot "
                    "be combined with verify, which reads the cache")
    if self.forced_commits is not None and not (
        isinstance(self.forced_commits, int)
        and 1 <= self.forced_commits <= self.block_m):
      errors.append(f"forced_commits must be an int in [1, block_m], got "
                    f"{self.forced_commits!r}")
    if self.max_refills is not None and not (
        isinstance(self.max_refills, int) and self.max_refills >= 1):
      errors.append(f"max_refills must be None or an int >= 1, got "
                    f"{self.max_refills!r}")
    if self.verify and self.block_m < 2:
      errors.append("verify needs block_m >= 2 (it checks block_m // 2 "
                    "candidates)")
    if not isinstance(self.mass_from_layer, int) or self.mass_from_layer < 0:
      errors.append(f"mass_from_layer must be an int >= 0, got "
                    f"{self.mass_from_layer!r}")
    if errors:
      raise ValueError("invalid Flash-dLLM arguments: " + "; ".join(errors))

  @property
  def num_steps(self) -> int:
    return self.gen_length  # at least one commit per step

  @property
  def extra_masks(self) -> int:
    return (self.mask_num - 1) * self.block_m

  @property
  def query_budget(self) -> int:
    return self.block_m * (1 + self.track_num) + self.extra_masks

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    b, n = tokens_BxN.shape
    return FlashCacheAux(cache=model.empty_cache(),
                         rank_BxN=jnp.full((b, n), NOT_SCORED, jnp.float32),
                         mass_BxN=jnp.zeros((b, n), jnp.float32),
                         new_BxN=jnp.zeros((b, n), bool),
                         committed_at_BxN=jnp.full((b, n), -1, jnp.int32),
                         fresh_B=jnp.ones((b,), bool))

  def reset_rows(self, aux: FlashCacheAux, rows_B: jax.Array) -> FlashCacheAux:
    """Forgets the rows' bookkeeping when a new request takes their slot; the
    cache needs no reset since their next step (a prefill) rewrites it."""
    r_Bx1 = rows_B[:, None]
    return aux.replace(
        rank_BxN=jnp.where(r_Bx1, NOT_SCORED, aux.rank_BxN),
        mass_BxN=jnp.where(r_Bx1, 0.0, aux.mass_BxN),
        new_BxN=aux.new_BxN & ~r_Bx1,
        committed_at_BxN=jnp.where(r_Bx1, -1, aux.committed_at_BxN),
        fresh_B=aux.fresh_B | rows_B)

  # Query selection (flash_budget.py) -----------------------------------------
  def _select(self, aux, open_BxN, decoded_BxN):
    """slots_BxQ (-1 = unused) laid out as [window | extra masks | tracked]."""
    w, x = self.block_m, self.extra_masks
    return flash_budget.select(
        aux.rank_BxN, aux.mass_BxN, aux.new_BxN, open_BxN, decoded_BxN,
        window=w, extra=x, tracked=self.query_budget - w - x)

  # One step ------------------------------------------------------------------
  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    trace = self.step_trace(model, state, prompt_len)
    return trace.tokens_BxN, trace.aux, trace.forwards_B

  def step_trace(self, model: SequenceModel, state: DecodeState,
                 prompt_len: int) -> "StepTrace":
    """One step, with the verify pass's plan and probabilities exposed so
    tests can check them against an independent forward."""
    tokens_BxN, aux = state.tokens_BxN, state.aux
    b, n = tokens_BxN.shape
    w, x = self.block_m, self.extra_masks
    open_BxN, decoded_BxN = flash_budget.candidates(model, tokens_BxN,
                                                     prompt_len)
    slots_BxQ = self._select(aux, open_BxN, decoded_BxN)
    scored_BxR = slots_BxQ[:, :w + x]
    # Dream predicts position i from row i - 1 (config.logits_shift).
    pred_BxR = jnp.where(scored_BxR >= 0,
                         scored_BxR - model.config.logits_shift, -1)
    window_rows_BxQ = (jnp.arange(slots_BxQ.shape[1])[None, :] < w) & (
        slots_BxQ >= 0)

    if self.recompute_all:
      logits_BxRxV = model.logits(tokens_BxN, jnp.maximum(pred_BxR, 0))
      cache, mass_BxN = aux.cache, aux.mass_BxN  # no cache, no mass
    else:
      prefill = lambda: self._prefill(model, tokens_BxN, slots_BxQ, pred_BxR,
                                      aux.cache)
      flash = lambda: self._flash(model, tokens_BxN, slots_BxQ, pred_BxR,
                                  window_rows_BxQ, aux.cache)

      def mixed():  # new requests in some slots: each row takes its own pass
        if self.max_refills is not None:
          return self._prefill_rows(model, tokens_BxN, slots_BxQ, pred_BxR,
                                    aux.fresh_B, flash())
        pick = lambda a, b_: jnp.where(
            aux.fresh_B.reshape((-1,) + (1,) * (a.ndim - 1)), a, b_)
        return jax.tree.map(pick, prefill(), flash())

      which = jnp.where(jnp.all(aux.fresh_B), 0,
                        jnp.where(jnp.any(aux.fresh_B), 1, 2))
      logits_BxRxV, cache, mass_BxN = jax.lax.switch(
          which, [prefill, mixed, flash])

    x0_BxR, conf_BxR = parallel_rules.confidence(logits_BxRxV)
    real_BxR = scored_BxR >= 0
    is_stop_BxR = flash_budget.is_stop(x0_BxR, model.stop_ids) & real_BxR
    # Window positions after a predicted stop token get no confidence.
    first_stop_B = jnp.min(jnp.where(is_stop_BxR[:, :w], scored_BxR[:, :w], n),
                           axis=1)
    conf_w_BxW = jnp.where(scored_BxR[:, :w] > first_stop_B[:, None], 0.0,
                           conf_BxR[:, :w])
    if self.forced_commits is not None:
      commit_BxW = parallel_rules.fixed_commit(
          conf_w_BxW, real_BxR[:, :w],
          jnp.full((b,), self.forced_commits, jnp.int32))
    else:
      commit_BxW = parallel_rules.threshold_commit(
          conf_w_BxW, real_BxR[:, :w], self.threshold)
    rows_Bx1 = jnp.arange(b)[:, None]
    drafts_BxW = x0_BxR[:, :w].astype(tokens_BxN.dtype)
    commit_slots_BxW = jnp.where(commit_BxW, scored_BxR[:, :w], n)
    tokens_BxN = tokens_BxN.at[rows_Bx1, commit_slots_BxW].set(
        drafts_BxW, mode="drop")
    forwards_B = jnp.ones((b,), jnp.int32)
    plan = p_BxC = keep_BxC = None
    committed_at_BxN = aux.committed_at_BxN.at[rows_Bx1, commit_slots_BxW].set(
        state.step, mode="drop")
    if self.verify:
      v = flash_verify.verify(
          model, tokens_BxN, committed_at_BxN, scored_BxR[:, :w], drafts_BxW,
          conf_w_BxW, commit_BxW, cache, block_m=self.block_m,
          gamma=self.gamma, accept_none=self.forced_commits is not None)
      plan, p_BxC, keep_BxC = v.plan, v.p_BxC, v.keep_BxC
      verified_BxC = jnp.where(keep_BxC, v.slots_BxC, n)
      tokens_BxN = tokens_BxN.at[rows_Bx1, verified_BxC].set(
          v.drafts_BxC, mode="drop")
      committed_at_BxN = committed_at_BxN.at[rows_Bx1, verified_BxC].set(
          state.step, mode="drop")
      commit_slots_BxW = jnp.concatenate([commit_slots_BxW, verified_BxC], 1)
      forwards_B = forwards_B + (plan.S_B > 0)
    new_BxN = jnp.zeros((b, n), bool).at[rows_Bx1, commit_slots_BxW].set(
        True, mode="drop")
    rank_BxN = aux.rank_BxN.at[rows_Bx1, jnp.where(real_BxR, scored_BxR, n)
                               ].set(conf_BxR, mode="drop")
    aux = FlashCacheAux(cache=cache, rank_BxN=rank_BxN, mass_BxN=mass_BxN,
                        new_BxN=new_BxN, committed_at_BxN=committed_at_BxN,
                        fresh_B=jnp.zeros_like(aux.fresh_B))
    return StepTrace(tokens_BxN, aux, forwards_B, plan, p_BxC, keep_BxC)

  def _prefill(self, model, tokens_BxN, slots_BxQ, pred_BxR, cache):
    """A row's first step: every position, so its cache starts complete."""
    b, n = tokens_BxN.shape
    w = self.block_m
    all_BxN = jnp.broadcast_to(jnp.arange(n), (b, n))
    # Predicting rows sit at their own positions in an all-position query.
    rows_BxR = jnp.maximum(pred_BxR, 0)
    window_BxN = jnp.zeros((b, n), bool).at[
        jnp.arange(b)[:, None], jnp.where(slots_BxQ[:, :w] >= 0,
                                          slots_BxQ[:, :w], n)].set(
                                              True, mode="drop")
    out = model.run(tokens_BxN, all_BxN, cache, rows_BxR,
                    extras=CachedExtras(mass_rows_BxQ=window_BxN),
                    mass_from_layer=self.mass_from_layer)
    return out.logits, out.cache, self._mass(out.mass_BxS, b, n)

  def _prefill_rows(self, model, tokens_BxN, slots_BxQ, pred_BxR, fresh_B,
                    flashed):
    """Prefills the (at most max_refills) fresh rows alone and puts their
    logits, mass and whole cache rows over the flash pass's `flashed`."""
    logits_BxRxV, cache, mass_BxN = flashed
    b = tokens_BxN.shape[0]
    idx_F = jnp.argsort(~fresh_B, stable=True)[:min(self.max_refills, b)]
    dest_F = jnp.where(fresh_B[idx_F], idx_F, b)  # b: not fresh, dropped
    rows = dataclasses.replace(model, positions_BxN=model.positions_BxN[idx_F],
                               valid_BxN=model.valid_BxN[idx_F])
    empty = KVCache.zeros(model.config, len(idx_F), tokens_BxN.shape[1],
                          cache.k[0].dtype)
    logits_F, cache_F, mass_F = self._prefill(
        rows, tokens_BxN[idx_F], slots_BxQ[idx_F], pred_BxR[idx_F], empty)
    put = lambda full, part: full.at[dest_F].set(part.astype(full.dtype),
                                                 mode="drop")
    cache = KVCache(k=tuple(map(put, cache.k, cache_F.k)),
                    v=tuple(map(put, cache.v, cache_F.v)))
    return put(logits_BxRxV, logits_F), cache, put(mass_BxN, mass_F)

  def _flash(self, model, tokens_BxN, slots_BxQ, pred_BxR, window_rows_BxQ,
             cache):
    b, n = tokens_BxN.shape
    r = pred_BxR.shape[1]
    rows_BxR = jnp.broadcast_to(jnp.arange(r), (b, r))
    if model.config.logits_shift:
      # Append the predicting rows (position i - 1 of each scored position);
      # a slot that appears twice is written twice with the same K/V.
      rows_BxR = rows_BxR + slots_BxQ.shape[1]
      slots_BxQ = jnp.concatenate([slots_BxQ, pred_BxR], axis=1)
      window_rows_BxQ = jnp.concatenate(
          [window_rows_BxQ, jnp.zeros((b, r), bool)], axis=1)
    q_tokens_BxQ = jnp.take_along_axis(tokens_BxN, jnp.maximum(slots_BxQ, 0),
                                       axis=1)
    out = model.run(q_tokens_BxQ, slots_BxQ, cache, rows_BxR,
                    extras=CachedExtras(mass_rows_BxQ=window_rows_BxQ,
                                        mass_prefix=self.block_m),
                    mass_from_layer=self.mass_from_layer)
    return out.logits, out.cache, self._mass(out.mass_BxS, b, n)

  def _mass(self, mass_BxS, b, n):
    if mass_BxS is None:  # every layer is below mass_from_layer
      return jnp.zeros((b, n), jnp.float32)
    return mass_BxS


class StepTrace(NamedTuple):
  """What one step did; plan / p / keep are None without verification."""

  tokens_BxN: jax.Array
  aux: FlashCacheAux
  forwards_B: jax.Array
  plan: flash_verify.VerifyPlan | None
  p_BxC: jax.Array | None
  keep_BxC: jax.Array | None
