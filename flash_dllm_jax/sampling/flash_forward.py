"""Flash-Cache's forward passes: a row's prefill and the budgeted step, and
the step's one forward choosing between them per row (budget_pass).

Both passes return (logits [B, R, V] of the predicting rows, the cache after the
pass, rank_BxN): the rank sums, over layers from sampler.rank_from_layer,
what each key draws from the window rows (q.k or attention mass).
exclude_BxS: slots no query attends to (the EOS tail past its keys).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flash_dllm_jax.model import CachedExtras, KVCache
from flash_dllm_jax.sampling import flash_budget


def _score(sampler) -> str:
  return "logit" if sampler.rank == "score" else "mass"


def prefill(sampler, model, tokens_BxN, slots_BxQ, pred_BxR, cache,
            exclude_BxS=None):
  """A row's first step: every position, so its cache starts complete."""
  b, n = tokens_BxN.shape
  w = sampler.block_m
  all_BxN = jnp.broadcast_to(jnp.arange(n), (b, n))
  # Predicting rows sit at their own positions in an all-position query.
  rows_BxR = jnp.maximum(pred_BxR, 0)
  window_BxN = jnp.zeros((b, n), bool).at[
      jnp.arange(b)[:, None], jnp.where(slots_BxQ[:, :w] >= 0,
                                        slots_BxQ[:, :w], n)].set(
                                            True, mode="drop")
  out = model.run(tokens_BxN, all_BxN, cache, rows_BxR,
                  extras=CachedExtras(mass_rows_BxQ=window_BxN,
                                      exclude_BxS=exclude_BxS,
                                      mass_score=_score(sampler)),
                  mass_from_layer=sampler.rank_from_layer)
  return out.logits, out.cache, _mass(out.mass_BxS, b, n)


def prefill_rows(sampler, model, tokens_BxN, slots_BxQ, pred_BxR, rows_B,
                 flashed, exclude_BxS=None, size: int | None = None):
  """Prefills the rows marked by rows_B [B] and puts their logits, mass and
  whole cache rows over the flash pass's `flashed` (logits, cache, mass).

  The rows run in whole groups of `size` (default max_refills, None: all
  B), then the marked rows left over one at a time, in loops: the only
  cache beside the batch's is one group's, a group's activations are
  size x N tokens', and a lone new row (a request arriving while others
  decode) costs one row's prefill, not a group's. A row's prefill depends
  on its own data only (every op is row-independent), so the grouping
  never changes a token."""
  logits_BxRxV, cache, mass_BxN = flashed
  b, n = tokens_BxN.shape
  size = min(size or sampler.max_refills or b, b)
  order_B = jnp.argsort(~rows_B, stable=True)  # marked rows first
  count = jnp.sum(rows_B)
  whole = count // size

  def run(rows: int, first):
    """The body of a loop whose i-th trip prefills marked rows first + i *
    rows ... (+ rows - 1)."""
    def group(i, carry):
      logits_BxRxV, cache, mass_BxN = carry
      at_F = first + i * rows + jnp.arange(rows)
      idx_F = order_B[jnp.minimum(at_F, b - 1)]
      dest_F = jnp.where(at_F < count, idx_F, b)  # b: past the marked
      part = dataclasses.replace(model,
                                 positions_BxN=model.positions_BxN[idx_F],
                                 valid_BxN=model.valid_BxN[idx_F])
      empty = KVCache.zeros(model.config, rows, n, cache.k[0].dtype)
      logits_F, cache_F, mass_F = prefill(
          sampler, part, tokens_BxN[idx_F], slots_BxQ[idx_F],
          pred_BxR[idx_F], empty,
          None if exclude_BxS is None else exclude_BxS[idx_F])
      put = lambda full, new: full.at[dest_F].set(new.astype(full.dtype),
                                                  mode="drop")
      cache = jax.tree.map(put, cache, cache_F)  # K, V (and 8-bit scales)
      return put(logits_BxRxV, logits_F), cache, put(mass_BxN, mass_F)
    return group

  carry = jax.lax.fori_loop(0, whole, run(size, 0),
                            (logits_BxRxV, cache, mass_BxN))
  if size == 1:
    return carry
  return jax.lax.fori_loop(0, count - whole * size, run(1, whole * size),
                           carry)


def flash(sampler, model, tokens_BxN, slots_BxQ, pred_BxR, window_rows_BxQ,
          cache, exclude_BxS=None, side=None):
  """A budgeted step: the query slots against the cache. side: a verify
  plan (flash_verify.VerifyPlan, no recent rows) run in the same forward as
  CachedExtras side rows, over the cache this step writes; then the logits
  of its score rows [B, C, V] come last in the returned tuple."""
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
  extras = CachedExtras(mass_rows_BxQ=window_rows_BxQ,
                        mass_prefix=sampler.block_m, exclude_BxS=exclude_BxS,
                        mass_score=_score(sampler))
  if side is not None:
    hidden_BxS = side.exclude_BxS if exclude_BxS is None else (
        side.exclude_BxS | exclude_BxS)
    rows_BxR = jnp.concatenate(
        [rows_BxR, side.score_rows_BxC + slots_BxQ.shape[1]], axis=1)
    q_tokens_BxQ = jnp.concatenate([q_tokens_BxQ, side.tokens_BxQ], axis=1)
    slots_BxQ = jnp.concatenate([slots_BxQ, side.slots_BxQ], axis=1)
    extras = extras.replace(side_rows=side.slots_BxQ.shape[1],
                            side_exclude_BxS=hidden_BxS,
                            side_inq_BxVxV=side.inq_BxQxQ)
  out = model.run(q_tokens_BxQ, slots_BxQ, cache, rows_BxR, extras=extras,
                  mass_from_layer=sampler.rank_from_layer)
  logits, mass_BxN = out.logits, _mass(out.mass_BxS, b, n)
  if side is None:
    return logits, out.cache, mass_BxN
  return logits[:, :r], out.cache, mass_BxN, logits[:, r:]


def _mass(mass_BxS, b, n):
  if mass_BxS is None:  # every layer is below rank_from_layer
    return jnp.zeros((b, n), jnp.float32)
  return mass_BxS


def budget_pass(sampler, model, state, prompt_len: int, side=None,
                skip_BxN=None):
  """The step's one Flash-Cache forward: (regions, slots_BxQ, logits of
  the scored rows [B, R, V], the cache after it, rank_BxN), and with a
  `side` verify plan (`flash`) the logits of its score rows (zeros for rows
  that take a prefill). skip_BxN: undecoded positions
  that take no window or extra row this step."""
  aux = state.aux
  b, n = state.tokens_BxN.shape
  w, x = sampler.block_m, sampler.extra_masks
  r = sampler._regions(model, state.tokens_BxN, prompt_len, aux, aux.fresh_B)
  tokens_BxN, decoded_BxN, exclude_BxS = (r.tokens_BxN, r.decoded_BxN,
                                          r.exclude_BxS)
  end_B = aux.end_B
  pool_BxN = r.undecoded_BxN if skip_BxN is None else (
      r.undecoded_BxN & ~skip_BxN)
  slots_BxQ = flash_budget.select(
      pool_BxN, decoded_BxN, end_B, aux.conf_BxN, aux.rank_BxN,
      aux.last_BxN, window_rule=sampler.window_rule, window=w, extra=x,
      tracked=sampler.query_budget - w - x, extra_end_B=r.extra_end_B)
  scored_BxR = slots_BxQ[:, :sampler._scored]
  # Dream predicts position i from row i - 1 (config.logits_shift).
  pred_BxR = jnp.where(scored_BxR >= 0,
                       scored_BxR - model.config.logits_shift, -1)
  window_rows_BxQ = (jnp.arange(slots_BxQ.shape[1])[None, :] < w) & (
      slots_BxQ >= 0)

  if sampler.recompute_all:
    logits_BxRxV = model.logits(tokens_BxN, jnp.maximum(pred_BxR, 0))
    cache, rank_BxN = aux.cache, aux.rank_BxN  # no cache, no rank
  else:
    # The flash pass on every row, then the new rows' prefill loop (no trip
    # without new rows), neither under a conditional, so the cache is
    # written in place: a conditional between a prefill and a flash pass
    # made XLA copy the whole cache every step. A step where every row is
    # new thus also runs the flash pass, whose rows the prefill replaces.
    flashed = flash(sampler, model, tokens_BxN, slots_BxQ, pred_BxR,
                    window_rows_BxQ, aux.cache, exclude_BxS, side)
    out = prefill_rows(sampler, model, tokens_BxN, slots_BxQ, pred_BxR,
                       aux.fresh_B, flashed[:3], exclude_BxS)
    if side is not None:  # zeros when every row prefills, as documented
      out = out + (jnp.where(jnp.all(aux.fresh_B), 0.0, flashed[3]),)
    logits_BxRxV, cache, rank_BxN = out[:3]
    if side is not None:
      return r, slots_BxQ, logits_BxRxV, cache, rank_BxN, out[3]
  return r, slots_BxQ, logits_BxRxV, cache, rank_BxN
