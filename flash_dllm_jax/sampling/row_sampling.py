"""Per-row sampling settings carried as data through the compiled loop.

`Sampling` is one request's settings (host side, validated); `RowSampling`
holds them per row ([B] arrays) in `DecodeState.sampling`, so rows with
different temperature / top_p / top_k, and different values of the
sampler's numeric rule options (threshold, factor, gamma: row_options.py),
decode in one compiled program. A sampler's `row_fields` names the Sampling
fields it takes per row. The reference samplers (LLaDA, Dream, LLaDA2) read
temperature / top_p / top_k with their own sampling rules (row_draws.py);
`propose_tokens` is the rule of Flash-dLLM, Fast-dLLM, Elastic-Cache and
llada2-flash.

`propose_tokens` turns a step's logits into (token, confidence, logprob) per
scored position; logprob is the token's log-probability under the model's
own softmax (before temperature and filters, as vLLM reports it). A row with temperature 0 takes the greedy argmax and its softmax
probability, exactly `commit_rules.confidence`. A row with temperature T > 0
samples from softmax(logits / T) restricted by top_k, then top_p (vLLM's
order: top_p's mass is counted over the top_k survivors), and its confidence
is the sampled token's probability under that restricted distribution. The
mask token is never sampled. The sampling and the filters run only when some
row needs them (lax.cond); every row's values come from its own logits and
its own key, and a row that needs neither takes the greedy values through
jnp.where, so a row's tokens never depend on the other rows' settings.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.sampling import draw_settings, select

# The logit of a token that may not be sampled: finite, so that a softmax
# over a tile of only such tokens (the logprob kernel's) stays finite.
_OUT = -1e30


@dataclasses.dataclass(frozen=True)
class Sampling:
  """One row's settings: temperature, top_p, top_k as draw_settings.py
  declares them (0: greedy; top_p 1 and top_k 0 or -1: off); threshold in (0, 1]: the confidence a position needs
  to commit under the threshold rule; factor > 0: the factor rule's;
  gamma: Flash-Verify's acceptance level, Elastic-Cache's drift level or
  diffusion-gemma-flash's kept-draft level (the sampler checks its range;
  row_options.py); max_temperature,
  min_temperature, exponent, entropy_bound, max_out_length, early_stop,
  stop_tokens: DiffusionGemma's canvas options under its sampler's names
  (its sampler checks them against its declaration). None: the sampler's
  own."""

  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  threshold: float | None = None
  factor: float | None = None
  gamma: float | None = None
  max_temperature: float | None = None
  min_temperature: float | None = None
  exponent: float | None = None
  entropy_bound: float | None = None
  max_out_length: int | None = None
  early_stop: str | None = None
  stop_tokens: tuple[int, ...] | None = None

  def __post_init__(self):
    errors = draw_settings.errors(self)
    h = self.threshold
    if h is not None and not (isinstance(h, (int, float))
                              and math.isfinite(h) and 0 < h <= 1):
      errors.append(f"threshold must be None or in (0, 1], got {h!r}")
    real = lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v))
    if self.factor is not None and not (real(self.factor)
                                        and self.factor > 0):
      errors.append(f"factor must be None or a number > 0, got "
                    f"{self.factor!r}")
    if self.gamma is not None and not real(self.gamma):
      errors.append(f"gamma must be None or a finite number, got "
                    f"{self.gamma!r}")
    if errors:
      raise ValueError("invalid sampling settings: " + "; ".join(errors))


GREEDY = Sampling()


def row_settings(sampler, sampling, n_rows: int
                 ) -> list[Sampling] | None:
  """Each row's Sampling (one for all, or one per row), or None: every row
  decodes with the sampler's own options.

  A row's Sampling replaces the sampler's own options for that row; a row
  without one (sampling None, or a None entry) keeps them (`own_sampling()`,
  GREEDY for samplers without such options). A sampler takes per row only
  its `row_fields` (the others must keep their defaults); one with none
  takes only greedy rows (its own options decide)."""
  own = getattr(sampler, "own_sampling", None)
  if sampling is None and own is not None:
    return None
  if sampling is None or isinstance(sampling, Sampling):
    rows = [sampling or GREEDY] * n_rows
  else:
    rows = list(sampling)
    if len(rows) != n_rows:
      raise ValueError(f"{len(rows)} sampling settings for {n_rows} prompts")
    for i, r in enumerate(rows):
      if r is None:
        rows[i] = GREEDY if own is None else own()
      elif not isinstance(r, Sampling):
        raise TypeError(f"sampling[{i}] must be a Sampling, got "
                        f"{type(r).__name__}")
  if row_fields(sampler):
    for name in unsupported_fields(sampler, rows):
      raise ValueError(f"{type(sampler).__name__} does not take a per-row "
                       f"{name} (it takes "
                       f"{', '.join(row_fields(sampler))})")
    return rows
  if any(r != GREEDY for r in rows):
    raise ValueError(f"{type(sampler).__name__} does not take per-row "
                     "sampling settings; use its own options (temperature, "
                     "top_p, ...)")
  return None


def row_fields(sampler) -> tuple[str, ...]:
  """The Sampling fields `sampler` takes per row (its `row_fields`; none:
  its decode state carries no RowSampling)."""
  return tuple(getattr(sampler, "row_fields", ()))


def unsupported_fields(sampler, rows: list[Sampling]) -> list[str]:
  """The Sampling fields some row sets that `sampler` does not take per
  row (see `row_fields`)."""
  fields = row_fields(sampler)
  return [f.name for f in dataclasses.fields(Sampling)
          if f.name not in fields
          and any(getattr(r, f.name) != getattr(GREEDY, f.name)
                  for r in rows)]


@struct.dataclass
class RowSampling:
  """temperature_B float32, top_p_B float32, top_k_B int32 (0: off),
  threshold_B, factor_B, gamma_B float32 (NaN: the sampler's own); extra:
  the sampler's own per-row arrays (`sampler.row_arrays(rows)`, its
  options resolved on the host), None for samplers without."""

  temperature_B: jax.Array
  top_p_B: jax.Array
  top_k_B: jax.Array
  threshold_B: jax.Array
  factor_B: jax.Array
  gamma_B: jax.Array
  extra: object = None

  @classmethod
  def host(cls, rows: list[Sampling], sampler=None) -> "RowSampling":
    """numpy arrays of the rows' settings (the engine fills them per slot);
    `sampler`: the one decoding them, whose `row_arrays` fills `extra`."""
    own = lambda name: np.array([np.nan if getattr(r, name) is None
                                 else getattr(r, name) for r in rows],
                                np.float32)
    arrays = getattr(sampler, "row_arrays", None)
    return cls(np.array([r.temperature for r in rows], np.float32),
               np.array([r.top_p for r in rows], np.float32),
               np.array([r.top_k for r in rows], np.int32),
               own("threshold"), own("factor"), own("gamma"),
               None if arrays is None else arrays(rows))

  @classmethod
  def of(cls, rows: list[Sampling], sampler=None) -> "RowSampling":
    return jax.tree.map(jnp.asarray, cls.host(rows, sampler))

  def where(self, pick_B: jax.Array, other: "RowSampling") -> "RowSampling":
    """Rows marked by pick_B from self, the rest from other."""
    return jax.tree.map(lambda a, b: jnp.where(
        pick_B.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), self, other)


def _restrict(l_BxRxV, top_p_B, top_k_B):
  """l_BxRxV with tokens outside each row's top_k, then top_p, at _OUT.
  A row's cutoff is the logit of its last kept token (ties with it stay)."""
  v = l_BxRxV.shape[-1]
  s_BxRxV = -jnp.sort(-l_BxRxV, axis=-1)  # descending
  rank_V = jnp.arange(v)
  k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), v)
  in_k_BxRxV = rank_V < k_B[:, None, None]
  p_BxRxV = jax.nn.softmax(jnp.where(in_k_BxRxV, s_BxRxV, -jnp.inf), -1)
  before_BxRxV = jnp.cumsum(p_BxRxV, axis=-1) - p_BxRxV
  p_Bx1x1 = top_p_B[:, None, None]
  # top_p 1 keeps everything (the float32 sums may reach 1 early)
  keep_BxRxV = in_k_BxRxV & ((before_BxRxV < p_Bx1x1) | (p_Bx1x1 >= 1))
  count_BxR = jnp.maximum(keep_BxRxV.sum(-1), 1)
  cutoff_BxR = jnp.take_along_axis(s_BxRxV, count_BxR[..., None] - 1, -1)
  return jnp.where(l_BxRxV >= cutoff_BxR, l_BxRxV, _OUT)


def propose_tokens(logits_BxRxV: jax.Array, sampling: RowSampling | None,
                   rng_B: jax.Array | None, mask_id: int
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(x0_BxR, conf_BxR, logprob_BxR): see the module docstring. sampling
  None: greedy."""
  x0_BxR = jnp.argmax(logits_BxRxV, axis=-1)
  lp_BxR = ops.token_logprob(logits_BxRxV, x0_BxR)
  conf_BxR = jnp.exp(lp_BxR)  # select.prob_of
  if sampling is None:
    return x0_BxR, conf_BxR, lp_BxR
  sample_B = sampling.temperature_B > 0
  filter_B = sample_B & ((sampling.top_p_B < 1) | (sampling.top_k_B > 0))

  def sampled(_):
    t_B = jnp.where(sample_B, sampling.temperature_B, 1.0)
    l_BxRxV = logits_BxRxV / t_B[:, None, None]
    l_BxRxV = l_BxRxV.at[..., mask_id].set(_OUT)
    l_BxRxV = jax.lax.cond(
        jnp.any(filter_B),
        lambda l: jnp.where(filter_B[:, None, None],
                            _restrict(l, sampling.top_p_B, sampling.top_k_B),
                            l),
        lambda l: l, l_BxRxV)
    g_BxRxV = select.row_gumbel(rng_B, l_BxRxV.shape[1:])
    s_BxR = jnp.argmax(l_BxRxV + g_BxRxV, axis=-1)
    p_BxR = select.prob_of(l_BxRxV, s_BxR)
    raw_BxR = ops.token_logprob(logits_BxRxV, s_BxR)
    pick_Bx1 = sample_B[:, None]
    return (jnp.where(pick_Bx1, s_BxR, x0_BxR),
            jnp.where(pick_Bx1, p_BxR, conf_BxR),
            jnp.where(pick_Bx1, raw_BxR, lp_BxR))

  return jax.lax.cond(jnp.any(sample_B), sampled,
                      lambda _: (x0_BxR, conf_BxR, lp_BxR), None)
