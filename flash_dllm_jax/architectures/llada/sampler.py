"""LLaDA's reference sampler (ML-GSAI/LLaDA generate.py semantics).

Semi-autoregressive blocks; within a block, a fixed number of the most
confident masked positions is committed each step (low_confidence) or a random
choice of them (random). Nothing is ever remasked.

Temperature comes from the sampler, or per row from `DecodeState.sampling`
(the same Gumbel-noise draw with each row's own temperature and key). Each
committed token's log-probability is read from the softmax of the logits
the step drew from (guided ones with cfg_scale), before noise and
logits_eos_inf.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import ops

from flash_dllm_jax.sampling import (checks, commit_rules, draw_settings,
                                     options, row_draws, select)
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.sampling.loop import Uncached
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

REMASKING = ("low_confidence", "random")


@dataclasses.dataclass(frozen=True)
class LLaDASampler(Uncached):
  """Arguments and defaults of LLaDA's `generate` (block_length defaults to
  the whole generation, as there). temperature is also per row
  (`DecodeState.sampling`, which replaces it where given)."""

  row_fields: ClassVar[tuple[str, ...]] = ("temperature",)

  gen_length: int = option(128, "answer tokens decoded", ge=1)
  steps: int = option(128, "model steps over the whole answer (a multiple "
                      "of the number of blocks)", ge=1)
  block_length: int | None = option(
      None, "tokens per block (divides gen_length)",
      ge=1, none="the whole answer (gen_length)")
  temperature: float = draw_settings.TEMPERATURE.field(0.0)
  cfg_scale: float = option(0.0, "classifier-free guidance scale (0: off; "
                            "above 0 a second, unprompted forward a step)",
                            ge=0)
  remasking: str = option("low_confidence", "which masks a step commits: "
                          "the most confident, or a random choice",
                          choices=REMASKING)
  logits_eos_inf: bool = option(False, "never draw EOS (its logit -inf)")
  confidence_eos_eot_inf: bool = option(
      False, "EOS and EOT never win on confidence")

  def __post_init__(self):
    options.check(self)
    if self.block_length is None:
      object.__setattr__(self, "block_length", self.gen_length)
    options.check(self, lambda: checks.block_schedule_errors(
        self.gen_length, self.block_length, self.steps))

  @property
  def num_blocks(self) -> int:
    return self.gen_length // self.block_length

  @property
  def steps_per_block(self) -> int:
    return self.steps // self.num_blocks

  @property
  def forwards_per_step(self) -> int:
    return 2 if self.cfg_scale > 0 else 1

  def transfer_counts(self) -> np.ndarray:
    """[steps] tokens committed per step: a block's masks spread evenly over
    its steps, the remainder going to the first steps."""
    per_block = commit_rules.even_counts(self.block_length,
                                         self.steps_per_block)
    return np.tile(np.asarray(per_block, np.int32), self.num_blocks)

  def own_sampling(self) -> Sampling:
    """The row settings this sampler's own options state."""
    return Sampling(temperature=self.temperature)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len)

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    config, tokens_BxN, step = model.config, state.tokens_BxN, state.step
    b = tokens_BxN.shape[0]
    block_len = self.block_length
    start = prompt_len + (step // self.steps_per_block) * block_len
    rows_BxL = jnp.broadcast_to(start + jnp.arange(block_len), (b, block_len))

    logits_BxLxV = model.logits(tokens_BxN, rows_BxL)
    if self.cfg_scale > 0:
      unprompted_BxN = tokens_BxN.at[:, :prompt_len].set(config.mask_token_id)
      uncond_BxLxV = model.logits(unprompted_BxN, rows_BxL)
      logits_BxLxV = uncond_BxLxV + (self.cfg_scale + 1) * (
          logits_BxLxV - uncond_BxLxV)
    model_BxLxV = logits_BxLxV  # the logprobs' softmax
    if self.logits_eos_inf:
      logits_BxLxV = select.set_logit(logits_BxLxV, config.eos_token_id,
                                      select.NEG_INF)
    noise_rng, order_rng = select.split_rows(rng_B, 2)
    rows = state.sampling
    if rows is None:
      x0_BxL = select.gumbel_argmax(logits_BxLxV, self.temperature, noise_rng)
    else:
      x0_BxL = row_draws.llada_x0(logits_BxLxV, rows.temperature_B, noise_rng)
    lp_BxL = ops.token_logprob(model_BxLxV, x0_BxL)

    if self.remasking == "low_confidence":
      conf_logits = logits_BxLxV
      if self.confidence_eos_eot_inf:
        # generate.py's `logits_with_noise[.., EOS] = logits[.., EOT] = -inf`
        # runs after x0: EOT always leaves the softmax, EOS only at T = 0,
        # where logits_with_noise is the same tensor as logits.
        conf_logits = select.set_logit(conf_logits, config.eot_token_id,
                                       select.NEG_INF)
        if rows is not None and config.eos_token_id is not None:
          greedy_B = rows.temperature_B == 0
          eos_V = jnp.arange(conf_logits.shape[-1]) == config.eos_token_id
          conf_logits = jnp.where(greedy_B[:, None, None] & eos_V,
                                  select.NEG_INF, conf_logits)
        elif rows is None and self.temperature == 0:
          conf_logits = select.set_logit(conf_logits, config.eos_token_id,
                                         select.NEG_INF)
      p_BxL = select.prob_of(conf_logits, x0_BxL)
    else:
      p_BxL = select.row_uniform(order_rng, (block_len,))

    block_BxL = jax.lax.dynamic_slice_in_dim(tokens_BxN, start, block_len, 1)
    masked_BxL = block_BxL == config.mask_token_id
    rule = commit_rules.Fixed(tuple(self.transfer_counts().tolist()))
    chosen_BxL = rule.commit(p_BxL, masked_BxL, jnp.broadcast_to(step, (b,)))
    block_BxL = jnp.where(chosen_BxL, x0_BxL.astype(block_BxL.dtype), block_BxL)
    tokens_BxN = jax.lax.dynamic_update_slice_in_dim(tokens_BxN, block_BxL,
                                                     start, 1)
    logprob_BxN = jax.lax.dynamic_update_slice_in_dim(
        jnp.zeros(tokens_BxN.shape, jnp.float32), lp_BxL, start, 1)
    return tokens_BxN, None, self.forwards_per_step, logprob_BxN
