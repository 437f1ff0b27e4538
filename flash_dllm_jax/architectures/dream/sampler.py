"""Dream's reference sampler (Dream-v0 `generation_utils._sample` semantics).

The logits row for position i is the model's raw row i-1 (Dream predicts the
next token AR-style), so the rows read are [P-1, N-2].

temperature / top_p / top_k come from the sampler, or per row from
`DecodeState.sampling` (row_draws.py: the same filters in Dream's order,
top_p then top_k, and the same confidences). Each committed token's
log-probability is read from the softmax of the model's logits, before
temperature and filters.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import ops
from flash_dllm_jax.sampling import (checks, commit_rules, draw_settings,
                                     options,
                                     row_draws, select)
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.sampling.loop import Uncached
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def torch_linspace_f32(start: float, end: float, n: int) -> np.ndarray:
  """torch.linspace in float32: the first half counts up from `start`, the
  second half down from `end`, each a fused multiply-add rounded once to
  float32 (torch's vectorised CPU kernel), so the schedule's int() rounding
  matches the reference. float64 holds step * idx + start exactly."""
  start32, end32 = np.float32(start), np.float32(end)
  if n == 1:
    return np.array([start32], np.float32)
  step = (end32 - start32) / np.float32(n - 1)
  idx = np.arange(n)
  step64 = np.float64(step)
  up = (np.float64(start32) + step64 * idx).astype(np.float32)
  down = (np.float64(end32) - step64 * (n - 1 - idx)).astype(np.float32)
  return np.where(idx < n // 2, up, down).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class DreamSampler(Uncached):
  """Arguments and defaults of Dream's `diffusion_generate`. temperature,
  top_p and top_k are also per row (`DecodeState.sampling`, which replaces
  them where given)."""

  row_fields: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k")

  gen_length: int = option(512, "answer tokens decoded", ge=1)
  steps: int = option(512, "model steps over the whole answer", ge=1)
  eps: float = option(1e-3, "the last timestep of the schedule 1 -> eps",
                      gt=0, lt=1)
  alg: str = option("origin", "which masks a step reveals: random "
                    "(origin) or by a confidence measure", choices=ALGS)
  temperature: float = draw_settings.TEMPERATURE.field(0.0)
  top_p: float | None = draw_settings.TOP_P.field()
  top_k: int | None = draw_settings.TOP_K.field()
  alg_temp: float | None = option(
      None, "temperature of the draw among the confidences (the "
      "confidence algorithms)", ge=0, none="take the most confident")

  def __post_init__(self):
    options.check(self)

  @property
  def forwards_per_step(self) -> int:
    return 1

  def timesteps(self) -> np.ndarray:
    return torch_linspace_f32(1.0, self.eps, self.steps + 1)

  def transfer_counts(self) -> np.ndarray:
    """[steps] positions committed per step by the confidence algorithms:
    int(masked * (1 - s/t)) in float32, everything left on the last step."""
    ts = self.timesteps()
    masked = self.gen_length
    counts = []
    for i in range(self.steps):
      if i < self.steps - 1:
        k = int(np.float32(masked) * (np.float32(1) - ts[i + 1] / ts[i]))
      else:
        k = masked
      counts.append(k)
      masked -= k
    return np.asarray(counts, np.int32)

  def reveal_probs(self) -> np.ndarray:
    """[steps] per-position reveal probability of `origin`: 1 - s/t, then 1."""
    ts = self.timesteps()
    probs = np.float32(1) - ts[1:] / ts[:-1]
    probs[-1] = 1
    return probs.astype(np.float32)

  def own_sampling(self) -> Sampling:
    """The row settings this sampler's own options state."""
    return Sampling(temperature=self.temperature,
                    top_p=1.0 if self.top_p is None else self.top_p,
                    top_k=self.top_k or 0)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len,
                      needs_prompt="Dream")

  def _sample(self, logits_BxGxV: jax.Array, rng_B: jax.Array, rows=None):
    """Dream's `sample_tokens`: (confidence_BxG, x0_BxG); rows: per-row
    settings (RowSampling) in place of the sampler's."""
    if rows is not None:
      logits_BxGxV = row_draws.dream_filtered(logits_BxGxV, rows)
      x0_BxG = row_draws.categorical_or_argmax(
          logits_BxGxV, rows.temperature_B > 0, rng_B)
    else:
      if self.temperature > 0:
        logits_BxGxV = logits_BxGxV / self.temperature
      if self.top_p is not None and self.top_p < 1:
        logits_BxGxV = select.top_p_filter(logits_BxGxV, self.top_p)
      if self.top_k is not None and self.top_k > 0:
        logits_BxGxV = select.top_k_filter(logits_BxGxV, self.top_k)
      if self.temperature > 0:
        x0_BxG = select.row_categorical(rng_B, logits_BxGxV)
      else:
        x0_BxG = jnp.argmax(logits_BxGxV, axis=-1)
    # Probabilities through select.prob_of, whose vocabulary sum does not
    # depend on the batch on a GPU (one pass per rule); only 'entropy' needs
    # all of them.
    if self.alg == "topk_margin":
      top2_BxGx2, idx_BxGx2 = jax.lax.top_k(logits_BxGxV, 2)
      p1_BxG = select.prob_of(logits_BxGxV, idx_BxGx2[..., 0])
      conf_BxG = p1_BxG * (1 - jnp.exp(top2_BxGx2[..., 1] - top2_BxGx2[..., 0]))
    elif self.alg == "entropy":
      probs_BxGxV = jax.nn.softmax(logits_BxGxV, axis=-1)
      conf_BxG = jnp.sum(probs_BxGxV * jnp.log(probs_BxGxV + 1e-10), axis=-1)
    else:
      conf_BxG = select.prob_of(logits_BxGxV, x0_BxG)
    return conf_BxG, x0_BxG

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    config, tokens_BxN, step = model.config, state.tokens_BxN, state.step
    b, g = tokens_BxN.shape[0], self.gen_length
    rows_BxG = jnp.broadcast_to(prompt_len - 1 + jnp.arange(g), (b, g))
    logits_BxGxV = model.logits(tokens_BxN, rows_BxG)
    sample_rng, choice_rng = select.split_rows(rng_B, 2)
    conf_BxG, x0_BxG = self._sample(logits_BxGxV, sample_rng, state.sampling)
    lp_BxG = ops.token_logprob(logits_BxGxV, x0_BxG)

    gen_BxG = tokens_BxN[:, prompt_len:]
    masked_BxG = gen_BxG == config.mask_token_id
    if self.alg == "origin":
      p = jnp.asarray(self.reveal_probs())[step]
      chosen_BxG = masked_BxG & (select.row_uniform(choice_rng, (g,)) < p)
    else:
      if self.alg_temp:
        # multinomial without replacement over softmax(conf / alg_temp) is
        # the top-k of conf / alg_temp + Gumbel noise.
        conf_BxG = conf_BxG / self.alg_temp + select.row_gumbel(
            choice_rng, (g,))
      rule = commit_rules.Fixed(tuple(self.transfer_counts().tolist()))
      chosen_BxG = rule.commit(conf_BxG, masked_BxG,
                               jnp.broadcast_to(step, (b,)))
    gen_BxG = jnp.where(chosen_BxG, x0_BxG.astype(gen_BxG.dtype), gen_BxG)
    logprob_BxN = jnp.zeros(tokens_BxN.shape, jnp.float32).at[
        :, prompt_len:].set(lp_BxG)
    return (tokens_BxN.at[:, prompt_len:].set(gen_BxG), None,
            self.forwards_per_step, logprob_BxN)
