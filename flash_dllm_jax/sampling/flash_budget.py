"""Flash-Cache's query budget and answer end: which positions a step runs.

Per row, a fixed number of query slots laid out as [window | extra | tracked]
(unused slots are -1):
  window  block_m masked positions, the only ones decoded and verified:
          "leftmost" (the reference) the leftmost masked positions, also
          those past the answer's end (they get no confidence);
          "confident" the open masks (before the end) best last confidence
          first, never-scored ones after them in position order;
  extra   the next (mask_num - 1) * block_m masks in that order, refreshed
          (K/V rewritten) but not decoded;
  tracked decoded positions in the reference's order: the last committed
          batch (`last_BxN`), then the highest rank of the last step.

The reference keeps every decoded position in one list, re-sorted after
each step by that step's rank except the batch committed last, which stays
at the end; the budget takes the list's tail. Only the tail's membership
matters, so the list is kept as (rank_BxN, last_BxN). Before a row's first
step its rank is the position itself: the list starts as the prompt in
position order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

WINDOWS = ("leftmost", "confident")
STOPS = ("eos", "first")
NOT_SCORED = -1.0  # last confidence of a mask that has never been scored
_TIER = jnp.finfo(jnp.float32).max  # above any rank: the last batch


def is_stop(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
  if not stop_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(stop_ids))


def end_tokens(model, stop: str) -> tuple[int, ...]:
  """The ids that fix the answer's end: EOS alone ("eos", the reference) or
  every stop id (EOS and EOT, "first"); none without stop_at_eos."""
  if not model.stop_ids:
    return ()
  return model.stop_ids if stop == "first" else (model.config.eos_token_id,)


def update_end(end_B, n: int, slots_BxK, tokens_BxK, committed_BxK, ids,
               stop: str):
  """The answer end after one commit batch (slots -1 = none; end N = none).

  "eos": fixed by the first batch that commits an end token, one past the
  largest such slot in it, then never moved (the reference). "first": one
  past the first end token committed so far (it can only move left).
  """
  hit_BxK = committed_BxK & is_stop(tokens_BxK, ids) & (slots_BxK >= 0)
  if stop == "first":
    first_B = jnp.min(jnp.where(hit_BxK, slots_BxK + 1, end_B[:, None]),
                      axis=1)
    return jnp.minimum(end_B, first_B)
  last_B = jnp.max(jnp.where(hit_BxK, slots_BxK + 1, -1), axis=1)
  return jnp.where(jnp.any(hit_BxK, axis=1) & (end_B >= n), last_B, end_B)


def select(masked_BxN, decoded_BxN, end_B, conf_BxN, rank_BxN, last_BxN, *,
           window_rule: str, window: int, extra: int, tracked: int):
  """slots_BxQ, Q = window + extra + tracked (see the module docstring).

  masked_BxN: undecoded generated positions; decoded_BxN: prompt and
  committed positions; end_B: the answer end (N if none); conf_BxN: last
  confidence of masks (NOT_SCORED if never); rank_BxN / last_BxN: the
  reference's order of decoded positions.
  """
  n = masked_BxN.shape[1]
  pos_N = jnp.arange(n)
  if window_rule == "leftmost":
    pool_BxN = masked_BxN
    key_BxN = jnp.where(pool_BxN, pos_N[None, :].astype(jnp.float32), jnp.inf)
  else:
    pool_BxN = masked_BxN & (pos_N[None, :] < end_B[:, None])
    key_BxN = jnp.where(pool_BxN, -conf_BxN, jnp.inf)
  order_BxN = jnp.argsort(key_BxN, axis=1, stable=True)
  n_pool_B = pool_BxN.sum(1)
  take = lambda order, count, k, start=0: jnp.where(
      jnp.arange(start, start + k)[None, :] < count[:, None],
      _pad_take(order, start, k), -1)
  window_BxW = take(order_BxN, n_pool_B, window)
  extra_BxA = take(order_BxN, n_pool_B, extra, start=window)
  track_key_BxN = jnp.where(decoded_BxN, order_key(rank_BxN, last_BxN),
                            -jnp.inf)
  track_order_BxN = jnp.argsort(-track_key_BxN, axis=1, stable=True)
  tracked_BxT = take(track_order_BxN, decoded_BxN.sum(1), tracked)
  return jnp.concatenate([window_BxW, extra_BxA, tracked_BxT], axis=1)


def order_key(rank_BxN, last_BxN):
  """Larger = later in the reference's list of decoded positions."""
  return jnp.where(last_BxN, _TIER, rank_BxN)


def recent_key(decoded_BxN, drafted_BxN, rank_BxN, last_BxN):
  """The verify pass's order after the draft commits (drafted_BxN): those
  last, then the list as it was; -inf for positions not decoded."""
  return jnp.where(drafted_BxN, jnp.inf, jnp.where(
      decoded_BxN, order_key(rank_BxN, last_BxN), -jnp.inf))


def initial_rank(b: int, n: int) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32), (b, n))


def _pad_take(order_BxN: jax.Array, start: int, k: int) -> jax.Array:
  """order[:, start:start + k], padded with -1 where it runs past N."""
  n = order_BxN.shape[1]
  if start >= n:
    return jnp.full((order_BxN.shape[0], k), -1, order_BxN.dtype)
  part = order_BxN[:, start:start + k]
  pad = k - part.shape[1]
  if pad:
    part = jnp.concatenate(
        [part, jnp.full((order_BxN.shape[0], pad), -1, order_BxN.dtype)], 1)
  return part
