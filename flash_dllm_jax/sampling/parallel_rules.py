"""Parallel decoding rules: which masked positions of a block to commit.

Pure functions of per-position confidences [B, L] (L: block length) and the
mask of still-masked positions; every rule returns a bool [B, L] commit mask
that only ever selects masked positions. Shared by Fast-dLLM-style samplers.

Confidence is the softmax probability of the argmax token. Fast-dLLM takes
it in float64; JAX runs with x64 off, so `confidence` uses float32
log-softmax (exp(-log sum exp(l - max)), no overflow and no cancellation):
relative error ~1e-7, so a threshold decision can differ from the reference
only when a confidence lies within ~1e-6 of its threshold.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.sampling import select


def confidence(logits_BxLxV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(x0_BxL, conf_BxL): greedy tokens and their softmax probabilities.

  Ties in the argmax go to the lower token id (as torch.argmax on CPU).
  """
  x0_BxL = jnp.argmax(logits_BxLxV, axis=-1)
  return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)


def _masked_conf(conf_BxL: jax.Array, masked_BxL: jax.Array) -> jax.Array:
  return jnp.where(masked_BxL, conf_BxL, select.NEG_INF)


def _top1(conf_BxL: jax.Array, masked_BxL: jax.Array) -> jax.Array:
  """The most confident masked position of each row (lowest index on ties);
  nothing for rows with no mask."""
  return select.choose_top(_masked_conf(conf_BxL, masked_BxL),
                           jnp.ones(conf_BxL.shape[:1], jnp.int32))


def threshold_commit(conf_BxL: jax.Array, masked_BxL: jax.Array,
                     tau: float) -> jax.Array:
  """Fast-dLLM `get_transfer_index` with a threshold: every masked position
  with conf >= tau, and always the most confident masked one (so each step
  makes progress). Rows with no mask commit nothing.

  When several masked positions tie for the maximum below tau, the reference
  keeps whichever torch.topk lists first; here the lowest index.
  """
  return (masked_BxL & (conf_BxL >= tau)) | _top1(conf_BxL, masked_BxL)


def factor_count(conf_BxL: jax.Array, masked_BxL: jax.Array,
                 f: float) -> jax.Array:
  """[B] how many masked positions Fast-dLLM's factor rule commits.

  `get_transfer_index_dynamic`: sort the m masked confidences c1 >= c2 >= ...
  and accept rank n while c_n >= 1 - f/(n+1), i.e. (n+1)(1 - c_n) <= f (rank
  1 always passes). The thresholds rise and c falls, so the accepted ranks
  form a prefix. Edge cases matched exactly: m = 0 commits nothing (the
  reference indexes an empty list there); and when the first failure is the
  last rank m >= 2, the reference's `top_i == len - 1` adjustment commits all
  m anyway (so m = 2 always commits both).
  """
  l = conf_BxL.shape[1]
  sorted_BxL = -jnp.sort(-_masked_conf(conf_BxL, masked_BxL), axis=1)
  n_L = jnp.arange(1, l + 1, dtype=jnp.float32)
  thresh_L = jnp.where(n_L == 1, -1.0, 1.0 - f / (n_L + 1))
  m_B = jnp.sum(masked_BxL, axis=1, dtype=jnp.int32)
  ok_BxL = (sorted_BxL >= thresh_L) & (jnp.arange(l) < m_B[:, None])
  count_B = jnp.sum(jnp.cumprod(ok_BxL, axis=1), axis=1, dtype=jnp.int32)
  return jnp.where((m_B >= 2) & (count_B == m_B - 1), m_B, count_B)


def factor_commit(conf_BxL: jax.Array, masked_BxL: jax.Array,
                  f: float) -> jax.Array:
  """The factor rule's commit mask: the `factor_count` most confident masked
  positions (ties to the lower index)."""
  return fixed_commit(conf_BxL, masked_BxL,
                      factor_count(conf_BxL, masked_BxL, f))


def fixed_commit(conf_BxL: jax.Array, masked_BxL: jax.Array,
                 k_B: jax.Array) -> jax.Array:
  """The k_B[b] most confident masked positions (LLaDA's fixed schedule);
  fewer if fewer are masked."""
  return select.choose_top(_masked_conf(conf_BxL, masked_BxL), k_B)
