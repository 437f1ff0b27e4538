"""Per-row draws in the reference samplers' own semantics (LLaDA, Dream,
LLaDA2), from `RowSampling` [B] arrays instead of sampler options.

A row with settings (temperature T, top_p p, top_k k) draws exactly what
the sampler built with those options draws from the same logits and key:
the same float operations, row by row. Filters and noise run only when
some row needs them (lax.cond), and a row that needs none takes the
unfiltered values through jnp.where, so a greedy row is bit-identical to
the greedy sampler and no row depends on the others' settings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.sampling import select


def _bcast(x_B: jax.Array) -> jax.Array:
  return x_B[:, None, None]


def top_k_rows(l_BxRxV: jax.Array, top_k_B: jax.Array) -> jax.Array:
  """select.top_k_filter with each row's k (k <= 0: the row unchanged)."""
  v = l_BxRxV.shape[-1]
  k_B = jnp.clip(top_k_B, 1, v)
  s_BxRxV = -jnp.sort(-l_BxRxV, axis=-1)
  kth_BxRx1 = jnp.take_along_axis(
      s_BxRxV, jnp.broadcast_to(_bcast(k_B - 1), s_BxRxV.shape[:2] + (1,)),
      -1)
  cut_BxRxV = jnp.where(l_BxRxV < kth_BxRx1, select.NEG_INF, l_BxRxV)
  return jnp.where(_bcast(top_k_B > 0), cut_BxRxV, l_BxRxV)


def top_p_rows(l_BxRxV: jax.Array, top_p_B: jax.Array) -> jax.Array:
  """select.top_p_filter with each row's p (p >= 1: the row unchanged)."""
  order = jnp.argsort(-l_BxRxV, axis=-1)
  sorted_l = jnp.take_along_axis(l_BxRxV, order, -1)
  cum = jnp.cumsum(jax.nn.softmax(sorted_l, axis=-1), axis=-1)
  remove_sorted = cum > _bcast(top_p_B)
  remove_sorted = jnp.concatenate(
      [jnp.zeros_like(remove_sorted[..., :1]), remove_sorted[..., :-1]], -1)
  remove = jnp.put_along_axis(jnp.zeros_like(remove_sorted), order,
                              remove_sorted, axis=-1, inplace=False)
  cut_BxRxV = jnp.where(remove, jnp.finfo(jnp.float32).min, l_BxRxV)
  return jnp.where(_bcast(top_p_B < 1), cut_BxRxV, l_BxRxV)


def _maybe(pick_B: jax.Array, fn, l_BxRxV: jax.Array) -> jax.Array:
  """fn(l) where some row is picked (fn leaves the others unchanged)."""
  return jax.lax.cond(jnp.any(pick_B), fn, lambda l: l, l_BxRxV)


def llada_x0(logits_BxRxV: jax.Array, temperature_B: jax.Array,
             rng_B: jax.Array) -> jax.Array:
  """select.gumbel_argmax with each row's temperature."""
  x0_BxR = jnp.argmax(logits_BxRxV, axis=-1)

  def noisy(_):
    g_BxRxV = select.row_gumbel(rng_B, logits_BxRxV.shape[1:])
    s_BxR = jnp.argmax(logits_BxRxV + _bcast(temperature_B) * g_BxRxV, -1)
    return jnp.where(temperature_B[:, None] > 0, s_BxR, x0_BxR)

  return jax.lax.cond(jnp.any(temperature_B > 0), noisy, lambda _: x0_BxR,
                      None)


def dream_filtered(logits_BxRxV: jax.Array, sampling) -> jax.Array:
  """Dream's `sample_tokens` logits: / T (T > 0), top_p, then top_k."""
  t_B, p_B, k_B = sampling.temperature_B, sampling.top_p_B, sampling.top_k_B
  l_BxRxV = jnp.where(_bcast(t_B > 0),
                      logits_BxRxV / _bcast(jnp.where(t_B > 0, t_B, 1.0)),
                      logits_BxRxV)
  l_BxRxV = _maybe(p_B < 1, lambda l: top_p_rows(l, p_B), l_BxRxV)
  return _maybe(k_B > 0, lambda l: top_k_rows(l, k_B), l_BxRxV)


def llada2_filtered(logits_BxRxV: jax.Array, sampling) -> jax.Array:
  """LLaDA2's `generate` logits for rows with T > 0: / T (T != 1), top_k,
  then top_p; rows with T = 0 unchanged (they take the argmax)."""
  t_B, p_B, k_B = sampling.temperature_B, sampling.top_p_B, sampling.top_k_B
  on_B = t_B > 0
  scale_B = on_B & (t_B != 1)
  l_BxRxV = jnp.where(_bcast(scale_B),
                      logits_BxRxV / _bcast(jnp.where(scale_B, t_B, 1.0)),
                      logits_BxRxV)
  l_BxRxV = _maybe(on_B & (k_B > 0),
                   lambda l: top_k_rows(l, jnp.where(on_B, k_B, 0)), l_BxRxV)
  return _maybe(on_B & (p_B < 1),
                lambda l: top_p_rows(l, jnp.where(on_B, p_B, 1.0)), l_BxRxV)


def categorical_or_argmax(l_BxRxV: jax.Array, sample_B: jax.Array,
                          rng_B: jax.Array) -> jax.Array:
  """[B, R]: a draw from softmax(l) (select.row_categorical) for the rows
  marked by sample_B, the argmax for the others."""
  x0_BxR = jnp.argmax(l_BxRxV, axis=-1)
  return jax.lax.cond(
      jnp.any(sample_B),
      lambda _: jnp.where(sample_B[:, None],
                          select.row_categorical(rng_B, l_BxRxV), x0_BxR),
      lambda _: x0_BxR, None)
