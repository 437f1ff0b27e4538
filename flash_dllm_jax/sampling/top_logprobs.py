"""The top-k alternatives of each committed token (OpenAI's `top_logprobs`).

A decode records them only when its DecodeState carries a `TopLogprobs`
buffer (`DecodeState.top`, [B, N, K]); a sampler that `records_top` then
returns, beside each written token's log-probability, the K likeliest
tokens of the distribution it was drawn from and their log-probabilities
(the model's softmax, likeliest first), and `advance` keeps them where a
token is written, as it keeps `logprob_BxN`. Without the buffer nothing is
computed, so the decode costs what it did.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TopLogprobs:
  """lp_BxNxK: log-probabilities, likeliest first; id_BxNxK: their tokens
  (zeros where nothing was recorded)."""

  lp_BxNxK: jax.Array
  id_BxNxK: jax.Array

  @classmethod
  def zeros(cls, b: int, n: int, k: int) -> "TopLogprobs":
    return cls(lp_BxNxK=jnp.zeros((b, n, k), jnp.float32),
               id_BxNxK=jnp.zeros((b, n, k), jnp.int32))

  @property
  def k(self) -> int:
    return self.lp_BxNxK.shape[-1]


def of_logits(logits_BxRxV: jax.Array, k: int, chosen_BxR=None,
              chosen_lp_BxR=None) -> tuple[jax.Array, jax.Array]:
  """(lp_BxRxK, id_BxRxK): the k likeliest tokens of softmax(logits) at
  each row and their log-probabilities (with chosen_BxR: `with_chosen`)."""
  logits = logits_BxRxV.astype(jnp.float32)
  top_BxRxK, id_BxRxK = jax.lax.top_k(logits, k)
  lse_BxR = jax.nn.logsumexp(logits, axis=-1)
  out = top_BxRxK - lse_BxR[..., None], id_BxRxK.astype(jnp.int32)
  return out if chosen_BxR is None else with_chosen(*out, chosen_BxR,
                                                    chosen_lp_BxR)


def with_chosen(lp_BxRxK, id_BxRxK, chosen_BxR, chosen_lp_BxR):
  """(lp_BxRxK, id_BxRxK) with the chosen token's entry, where it is among
  them, set to its own reported log-probability (chosen_lp_BxR, the very
  array the decode reports), so the two never disagree."""
  own_BxRxK = id_BxRxK == chosen_BxR[..., None]
  return jnp.where(own_BxRxK, chosen_lp_BxR[..., None], lp_BxRxK), id_BxRxK


def put(top: TopLogprobs, rows_Bx1: jax.Array, slots_BxR: jax.Array,
        lp_BxRxK: jax.Array, id_BxRxK: jax.Array) -> TopLogprobs:
  """`top` with positions slots_BxR (out of range: dropped) set."""
  return TopLogprobs(
      lp_BxNxK=top.lp_BxNxK.at[rows_Bx1, slots_BxR].set(lp_BxRxK,
                                                         mode="drop"),
      id_BxNxK=top.id_BxNxK.at[rows_Bx1, slots_BxR].set(id_BxRxK,
                                                         mode="drop"))


def keep(kept: TopLogprobs, new: TopLogprobs,
         written_BxN: jax.Array) -> TopLogprobs:
  """`new` where a token was written (written_BxN), else `kept`."""
  w = written_BxN[..., None]
  return TopLogprobs(lp_BxNxK=jnp.where(w, new.lp_BxNxK, kept.lp_BxNxK),
                     id_BxNxK=jnp.where(w, new.id_BxNxK, kept.id_BxNxK))
