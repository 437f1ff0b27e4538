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


def group_sizes(refills: int, b: int) -> tuple[int, ...]:
  """The prefill group sizes of a step with fresh rows: refills, 2 refills,
  4 refills, ..., up to b."""
  sizes = [min(refills, b)]
  while sizes[-1] < b:
    sizes.append(min(2 * sizes[-1], b))
  return tuple(sizes)


def prefill_rows(sampler, model, tokens_BxN, slots_BxQ, pred_BxR, fresh_B,
                 flashed, exclude_BxS=None, size: int | None = None):
  """Prefills the (at most `size`, default max_refills) fresh rows alone
  and puts their logits, mass and whole cache rows over the flash pass's
  `flashed`."""
  logits_BxRxV, cache, mass_BxN = flashed
  b = tokens_BxN.shape[0]
  size = min(size or sampler.max_refills, b)
  idx_F = jnp.argsort(~fresh_B, stable=True)[:size]
  dest_F = jnp.where(fresh_B[idx_F], idx_F, b)  # b: not fresh, dropped
  rows = dataclasses.replace(model, positions_BxN=model.positions_BxN[idx_F],
                             valid_BxN=model.valid_BxN[idx_F])
  empty = KVCache.zeros(model.config, len(idx_F), tokens_BxN.shape[1],
                        cache.k[0].dtype)
  logits_F, cache_F, mass_F = prefill(
      sampler, rows, tokens_BxN[idx_F], slots_BxQ[idx_F], pred_BxR[idx_F],
      empty, None if exclude_BxS is None else exclude_BxS[idx_F])
  put = lambda full, part: full.at[dest_F].set(part.astype(full.dtype),
                                               mode="drop")
  cache = KVCache(k=tuple(map(put, cache.k, cache_F.k)),
                  v=tuple(map(put, cache.v, cache_F.v)))
  return put(logits_BxRxV, logits_F), cache, put(mass_BxN, mass_F)


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
  b = state.tokens_BxN.shape[0]
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
    def run_prefill():
      out = prefill(sampler, model, tokens_BxN, slots_BxQ, pred_BxR,
                    aux.cache, exclude_BxS)
      if side is None:
        return out
      c = side.score_rows_BxC.shape[1]
      return *out, jnp.zeros((b, c, out[0].shape[-1]), out[0].dtype)

    run_flash = lambda: flash(
        sampler, model, tokens_BxN, slots_BxQ, pred_BxR, window_rows_BxQ,
        aux.cache, exclude_BxS, side)

    def run_mixed():  # new requests in some slots: each row takes its own pass
      if sampler.max_refills is not None:
        # the smallest group that holds every fresh row (the server may
        # admit more than max_refills at once)
        sizes = group_sizes(sampler.max_refills, b)

        def group(size):
          def run():
            flashed = run_flash()
            out = prefill_rows(
                sampler, model, tokens_BxN, slots_BxQ, pred_BxR, aux.fresh_B,
                flashed[:3], exclude_BxS, size=size)
            return out + tuple(flashed[3:])
          return run
        if len(sizes) == 1:
          return group(sizes[0])()
        pick = jnp.searchsorted(jnp.asarray(sizes), jnp.sum(aux.fresh_B))
        return jax.lax.switch(pick, [group(s) for s in sizes])
      pick = lambda a, b_: jnp.where(
          aux.fresh_B.reshape((-1,) + (1,) * (a.ndim - 1)), a, b_)
      return jax.tree.map(pick, run_prefill(), run_flash())

    which = jnp.where(jnp.all(aux.fresh_B), 0,
                      jnp.where(jnp.any(aux.fresh_B), 1, 2))
    out = jax.lax.switch(which, [run_prefill, run_mixed, run_flash])
    logits_BxRxV, cache, rank_BxN = out[:3]
    if side is not None:
      return r, slots_BxQ, logits_BxRxV, cache, rank_BxN, out[3]
  return r, slots_BxQ, logits_BxRxV, cache, rank_BxN
