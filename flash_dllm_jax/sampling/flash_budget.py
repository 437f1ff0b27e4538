"""Flash-Cache's query budget: which positions one step recomputes.

Per row, a fixed number of query slots laid out as [window | extra | tracked]:
  window  block_m open masked positions, best confidence (as last scored)
          first, never-scored ones in position order;
  extra   the next (mask_num - 1) * block_m open masks in that order,
          refreshed but not decoded;
  tracked newly committed positions, then the other real positions that drew
          the most attention mass from the window in the previous step.
Unused slots are -1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_stop(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
  if not stop_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(stop_ids))


def candidates(model, tokens_BxN: jax.Array, prompt_len: int):
  """(open_BxN: masked positions still part of the answer; others_BxN: every
  other real position — decoded tokens, and masks dropped after a stop token
  — which may only be refreshed as tracked positions)."""
  cfg = model.config
  n = tokens_BxN.shape[1]
  gen_BxN = jnp.arange(n)[None, :] >= prompt_len
  masked_BxN = (tokens_BxN == cfg.mask_token_id) & gen_BxN
  stop_BxN = is_stop(tokens_BxN, model.stop_ids) & gen_BxN
  first_stop_B = jnp.where(stop_BxN.any(1), jnp.argmax(stop_BxN, 1), n)
  open_BxN = masked_BxN & (jnp.arange(n)[None, :] < first_stop_B[:, None])
  return open_BxN, model.valid_BxN & ~open_BxN


def select(rank_BxN, mass_BxN, new_BxN, open_BxN, decoded_BxN, *,
           window: int, extra: int, tracked: int) -> jax.Array:
  """slots_BxQ (-1 = unused), Q = window + extra + tracked.

  rank_BxN: last confidence of each masked position (negative if never
  scored); mass_BxN: attention mass from the last window; new_BxN: positions
  committed in the last step (tracked first).
  """
  mask_key_BxN = jnp.where(open_BxN, -rank_BxN, jnp.inf)
  mask_order_BxN = jnp.argsort(mask_key_BxN, axis=1, stable=True)
  n_open_B = open_BxN.sum(1)
  take = lambda order, count, k, start=0: jnp.where(
      jnp.arange(start, start + k)[None, :] < count[:, None],
      _pad_take(order, start, k), -1)
  window_BxW = take(mask_order_BxN, n_open_B, window)
  extra_BxX = take(mask_order_BxN, n_open_B, extra, start=window)
  track_key_BxN = jnp.where(decoded_BxN,
                            -jnp.where(new_BxN, jnp.inf, mass_BxN), jnp.inf)
  track_order_BxN = jnp.argsort(track_key_BxN, axis=1, stable=True)
  tracked_BxT = take(track_order_BxN, decoded_BxN.sum(1), tracked)
  return jnp.concatenate([window_BxW, extra_BxX, tracked_BxT], axis=1)


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
