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

from typing import NamedTuple

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


TAIL_KEYS = 128  # the reference's key tiles: its sequence runs on to them


class Regions(NamedTuple):
  """A step's view of the sequence (see `regions`).

  tokens_BxN: the tokens, the EOS tail filled in for rows at their prefill;
  undecoded_BxN: masks of the generation and tail positions not committed;
  decoded_BxN: prompt and committed positions; exclude_BxS: slots no query
  attends to (None: none); extra_end_B: extra masks lie before it; gen_end:
  the first position after the generation region.
  """

  tokens_BxN: jax.Array
  undecoded_BxN: jax.Array
  decoded_BxN: jax.Array
  exclude_BxS: jax.Array | None
  extra_end_B: jax.Array
  gen_end: int


def regions(model, tokens_BxN, prompt_len: int, gen_length: int, block_m: int,
            eos_tail: bool, tail_done_BxN, fresh_B) -> Regions:
  """Without the tail the sequence is prompt + generation. With it, as the
  reference lays a row out (P its real prompt length): EOS tokens after the
  generation up to ((P + G + block_m) // 128 + 1) * 128 positions, the keys
  ending at (P + G) // 128 * 128 + 128; tail positions are undecoded until
  committed, queries beyond the keys attend but are never attended to."""
  b, n = tokens_BxN.shape
  pos_N = jnp.arange(n)
  gen_end = prompt_len + gen_length
  masked_BxN = (tokens_BxN == model.config.mask_token_id) & (
      pos_N[None, :] >= prompt_len) & (pos_N[None, :] < gen_end)
  if not eos_tail:
    return Regions(tokens_BxN, masked_BxN, model.valid_BxN & ~masked_BxN,
                   None, jnp.full((b,), n, jnp.int32), gen_end)
  p_B = model.valid_BxN[:, :prompt_len].sum(1)
  start_B = prompt_len - p_B  # the row's first real position
  keys_end_B = start_B + (p_B + gen_length) // TAIL_KEYS * TAIL_KEYS + TAIL_KEYS
  row_end_B = start_B + ((p_B + gen_length + block_m) // TAIL_KEYS + 1
                         ) * TAIL_KEYS
  tail_BxN = (pos_N[None, :] >= gen_end) & (pos_N[None, :] < row_end_B[:, None])
  tokens_BxN = jnp.where(fresh_B[:, None] & tail_BxN,
                         model.config.eos_token_id, tokens_BxN)
  undecoded_BxN = masked_BxN | (tail_BxN & ~tail_done_BxN)
  inside_BxN = model.valid_BxN & (pos_N[None, :] < row_end_B[:, None])
  return Regions(tokens_BxN, undecoded_BxN, inside_BxN & ~undecoded_BxN,
                 pos_N[None, :] >= keys_end_B[:, None], keys_end_B, gen_end)


def effective_end(end_B, n: int, gen_end: int):
  """The answer's end: one past its end token, the generation's end while
  none is committed (end_B = N + 1)."""
  return jnp.where(end_B > n, gen_end, end_B)


def update_end(end_B, n: int, slots_BxK, tokens_BxK, committed_BxK, ids,
               stop: str):
  """The answer end after one commit batch (slots -1 = none; end N + 1 =
  none yet).

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
  return jnp.where(jnp.any(hit_BxK, axis=1) & (end_B > n), last_B, end_B)


def select(masked_BxN, decoded_BxN, end_B, conf_BxN, rank_BxN, last_BxN, *,
           window_rule: str, window: int, extra: int, tracked: int,
           extra_end_B=None):
  """slots_BxQ, Q = window + extra + tracked (see the module docstring).

  masked_BxN: undecoded positions; decoded_BxN: prompt and committed
  positions; end_B: the answer's effective end; conf_BxN: last confidence of
  masks (NOT_SCORED if never); rank_BxN / last_BxN: the reference's order of
  decoded positions; extra_end_B: extra masks lie before it (the keys' end).
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
  if extra_end_B is not None:
    extra_BxA = jnp.where(extra_BxA < extra_end_B[:, None], extra_BxA, -1)
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


def record_confidence(conf_BxN, scored_BxR, conf_BxR):
  """conf_BxN with the scored rows' confidences written at their slots
  (-1 = none): the "confident" window's memory."""
  b, n = conf_BxN.shape
  at_BxR = jnp.where(scored_BxR >= 0, scored_BxR, n)
  return conf_BxN.at[jnp.arange(b)[:, None], at_BxR].set(conf_BxR,
                                                         mode="drop")


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
