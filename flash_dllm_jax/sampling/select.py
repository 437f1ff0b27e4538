"""Token proposals and position selection shared by every sampler.

Logits are float32 [B, R, V]; confidences are [B, R] with -inf marking
positions that may not be chosen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax import ops

NEG_INF = -jnp.inf


def split_rows(rng_B: jax.Array, n: int) -> list[jax.Array]:
  """n independent [B] key arrays from one key per row."""
  keys_Bxn = jax.vmap(lambda k: jax.random.split(k, n))(rng_B)
  return [keys_Bxn[:, i] for i in range(n)]


def row_uniform(rng_B: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """[B, *shape] uniform draws, row b from its own key only."""
  return jax.vmap(lambda k: jax.random.uniform(k, shape))(rng_B)


def row_gumbel(rng_B: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  return jax.vmap(lambda k: jax.random.gumbel(k, shape, jnp.float32))(rng_B)


def row_categorical(rng_B: jax.Array, logits_BxRxV: jax.Array) -> jax.Array:
  """[B, R] samples from softmax(logits), row b from its own key only."""
  return jax.vmap(lambda k, l: jax.random.categorical(k, l, axis=-1))(
      rng_B, logits_BxRxV)


def set_logit(logits_BxRxV: jax.Array, token_id: int | None,
              value: float) -> jax.Array:
  if token_id is None:
    return logits_BxRxV
  return logits_BxRxV.at[..., token_id].set(value)


def gumbel_argmax(logits_BxRxV: jax.Array, temperature: float,
                  rng_B: jax.Array) -> jax.Array:
  """argmax(logits + T * Gumbel): a sample from softmax(logits / T).

  LLaDA's `add_gumbel_noise` computes exp(l) / (-log U)^T, whose argmax is the
  same; T = 0 is a plain argmax.
  """
  if temperature == 0:
    return jnp.argmax(logits_BxRxV, axis=-1)
  g = row_gumbel(rng_B, logits_BxRxV.shape[1:])
  return jnp.argmax(logits_BxRxV + temperature * g, axis=-1)


def prob_of(logits_BxRxV: jax.Array, tokens_BxR: jax.Array) -> jax.Array:
  """softmax(logits)[token], the probability the model gives each token
  (float32; a row's value does not depend on the other rows, see
  ops.token_logprob)."""
  return jnp.exp(ops.token_logprob(logits_BxRxV, tokens_BxR))


def top_p_filter(logits_BxRxV: jax.Array, top_p: float) -> jax.Array:
  """Keeps the smallest prefix (by probability) whose mass exceeds top_p; the
  rest get the lowest finite float (Dream's `top_p_logits`)."""
  order = jnp.argsort(-logits_BxRxV, axis=-1)
  sorted_logits = jnp.take_along_axis(logits_BxRxV, order, -1)
  cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
  remove_sorted = cum > top_p
  remove_sorted = jnp.concatenate(
      [jnp.zeros_like(remove_sorted[..., :1]), remove_sorted[..., :-1]], -1)
  remove = jnp.zeros_like(remove_sorted)
  remove = jnp.put_along_axis(remove, order, remove_sorted, axis=-1,
                              inplace=False)
  return jnp.where(remove, jnp.finfo(jnp.float32).min, logits_BxRxV)


def top_k_filter(logits_BxRxV: jax.Array, top_k: int) -> jax.Array:
  """Logits below the k-th largest become -inf (Dream's `top_k_logits`)."""
  top_k = min(top_k, logits_BxRxV.shape[-1])
  kth = jax.lax.top_k(logits_BxRxV, top_k)[0][..., -1:]
  return jnp.where(logits_BxRxV < kth, NEG_INF, logits_BxRxV)


def choose_top(confidence_BxR: jax.Array, k_B: jax.Array) -> jax.Array:
  """[B, R] bool: the k_B[b] highest-confidence positions of each row.

  Ties go to the lower index. Positions with -inf confidence are never chosen.
  """
  order_BxR = jnp.argsort(-confidence_BxR, axis=-1, stable=True)
  rank_BxR = jnp.argsort(order_BxR, axis=-1)
  return (rank_BxR < k_B[:, None]) & (confidence_BxR > NEG_INF)
