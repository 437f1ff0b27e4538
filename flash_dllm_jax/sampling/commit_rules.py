"""Commit rules: which masked positions a decoding step commits.

A rule is a small frozen policy object, `rule.commit(conf_BxL, masked_BxL,
step_B)` -> bool [B, L], that only ever selects masked positions (L: the
positions the step scores, a block or a window; step_B: the steps each row
has spent, which only `Fixed` reads). Every sampler with a choice of rule
takes the same options and builds its rule with `make`:

  rule="threshold"  every masked position with conf >= `threshold`, and
                    always the most confident one (each step progresses);
  rule="factor"     Fast-dLLM's factor rule with `factor`;
  rule="fixed"      exactly k per step, the most confident first: LLaDA's
                    even schedule of `steps` steps (`even_counts`), also the
                    benchmarks' schedule (step counts independent of the
                    weights). LLaDA's and Dream's samplers commit by `Fixed`
                    with their own schedules.

Confidence is the softmax probability of the argmax token. Fast-dLLM takes
it in float64; JAX runs with x64 off, so `confidence` uses float32
log-softmax (exp(-log sum exp(l - max)), no overflow and no cancellation):
relative error ~1e-7, so a threshold decision can differ from the reference
only when a confidence lies within ~1e-6 of its threshold.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp

from flash_dllm_jax.sampling import row_sampling, select


def confidence(logits_BxLxV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(x0_BxL, conf_BxL): greedy tokens and their softmax probabilities.

  Ties in the argmax go to the lower token id (as torch.argmax on CPU).
  """
  x0_BxL = jnp.argmax(logits_BxLxV, axis=-1)
  return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)


def proposal(logits_BxLxV: jax.Array, state, rng_B,
             mask_id: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(x0_BxL, conf_BxL, logprob_BxL) under each row's sampling settings
  (`state.sampling`, row_sampling.py): `confidence` for greedy rows."""
  return row_sampling.propose_tokens(logits_BxLxV, state.sampling, rng_B,
                                     mask_id)


def row_value(state, name: str, own: float):
  """[B] each row's option `name` (`state.sampling.<name>_B`, NaN: `own`,
  the sampler's; row_options.py), or `own` without row settings."""
  s = state.sampling
  if s is None:
    return own
  v_B = getattr(s, name + "_B")
  return jnp.where(jnp.isnan(v_B), jnp.float32(own), v_B)


def row_rule(rule: "CommitRule", state) -> "CommitRule":
  """`rule` with each row's own threshold or factor (`row_value`) for the
  threshold and factor rules; other rules as they are."""
  if state.sampling is None:
    return rule
  if isinstance(rule, Threshold):
    return Threshold(row_value(state, "threshold", rule.threshold)[:, None])
  if isinstance(rule, Factor):
    return Factor(row_value(state, "factor", rule.factor)[:, None])
  return rule


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
                 f) -> jax.Array:
  """[B] how many masked positions Fast-dLLM's factor rule commits.

  `get_transfer_index_dynamic`: sort the m masked confidences c1 >= c2 >= ...
  and accept rank n while c_n >= 1 - f/(n+1), i.e. (n+1)(1 - c_n) <= f (rank
  1 always passes). The thresholds rise and c falls, so the accepted ranks
  form a prefix. Edge cases matched exactly: m = 0 commits nothing (the
  reference indexes an empty list there); and when the first failure is the
  last rank m >= 2, the reference's `top_i == len - 1` adjustment commits all
  m anyway (so m = 2 always commits both). f: a number, or [B, 1] (a factor
  per row).
  """
  l = conf_BxL.shape[1]
  sorted_BxL = -jnp.sort(-_masked_conf(conf_BxL, masked_BxL), axis=1)
  n_L = jnp.arange(1, l + 1, dtype=jnp.float32)
  thresh_BxL = jnp.where(n_L == 1, -1.0, 1.0 - f / (n_L + 1))
  m_B = jnp.sum(masked_BxL, axis=1, dtype=jnp.int32)
  ok_BxL = (sorted_BxL >= thresh_BxL) & (jnp.arange(l) < m_B[:, None])
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


class CommitRule(Protocol):
  def commit(self, conf_BxL: jax.Array, masked_BxL: jax.Array,
             step_B: jax.Array) -> jax.Array:
    """bool [B, L]: the masked positions this step commits."""


@dataclasses.dataclass(frozen=True)
class Threshold:
  threshold: float

  def commit(self, conf_BxL, masked_BxL, step_B=None):
    return threshold_commit(conf_BxL, masked_BxL, self.threshold)


@dataclasses.dataclass(frozen=True)
class Factor:
  factor: float

  def commit(self, conf_BxL, masked_BxL, step_B=None):
    return factor_commit(conf_BxL, masked_BxL, self.factor)


@dataclasses.dataclass(frozen=True)
class Fixed:
  """counts[s] positions at a row's step s (the last count past the end)."""

  counts: tuple[int, ...]

  def commit(self, conf_BxL, masked_BxL, step_B):
    counts_S = jnp.asarray(self.counts, jnp.int32)
    k_B = counts_S[jnp.minimum(step_B, len(self.counts) - 1)]
    return fixed_commit(conf_BxL, masked_BxL, k_B)


RULES = ("threshold", "factor", "fixed")


def even_counts(total: int, steps: int) -> tuple[int, ...]:
  """`total` positions over `steps` steps as evenly as possible, the
  remainder to the first steps (LLaDA's `get_num_transfer_tokens`)."""
  base, extra = divmod(total, steps)
  return tuple(base + (i < extra) for i in range(steps))


def make(rule: str, *, threshold: float | None = None,
         factor: float | None = None,
         counts: tuple[int, ...] | None = None) -> CommitRule:
  """The policy object of a sampler's `rule` option."""
  if rule == "threshold":
    return Threshold(threshold)
  if rule == "factor":
    return Factor(factor)
  if rule == "fixed":
    return Fixed(tuple(counts))
  raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


WINDOW_RULES = ("threshold", "fixed")


class WindowRule:
  """The commit rule of a window sampler (Flash-dLLM, Elastic-Cache; its
  fields rule, threshold, steps, gen_length): "fixed" spreads `steps`
  (default gen_length) over the whole generation."""

  @property
  def commit_rule(self) -> CommitRule:
    counts = even_counts(self.gen_length, self.steps or self.gen_length)
    return make(self.rule, threshold=self.threshold, counts=counts)


def window_errors(sampler, per_step: tuple[str, int]) -> list[str]:
  """The joint rule errors of a window sampler whose fields are each valid
  (options.check): `steps` only with rule="fixed", at most gen_length,
  committing at most per_step = (name, size) positions a step."""
  rule, steps, gen_length = sampler.rule, sampler.steps, sampler.gen_length
  if steps is None:
    return []
  if rule != "fixed":
    return [f"steps ({steps}) applies to rule='fixed' only, not {rule!r}"]
  if steps > gen_length:
    return [f"steps must be an int in [1, gen_length ({gen_length})], got "
            f"{steps!r}"]
  if -(-gen_length // steps) > per_step[1]:
    return [f"steps ({steps}) commits up to {-(-gen_length // steps)} "
            f"tokens a step, more than {per_step[0]} ({per_step[1]})"]
  return []
