"""diffusion-gemma-flash: the official canvas sampler whose confident
rejected drafts ride in the next denoising pass to be verified there,
instead of being renoised.

Each denoising step is the official one (sampler.py, sampler_steps.py:
the same forward, annealed temperature, draws and random calls) except
for which draws stay in the canvas. The official step keeps the draws the
entropy bound accepts and renoises every other position with a uniform id.
Here a rejected draw d_i whose probability under the step's shaped logits
is >= gamma also stays (gamma > 1/2, so d_i is that pass's argmax); the
rest are renoised as before. The next pass sees the kept drafts as its
canvas and verifies them: the early-stop rule's token stability holds
only where that pass's argmax equals its input canvas, so a canvas
finishes only at a pass that agrees with every kept draft (and whose mean
entropy is under the rule's bound); a draft it disagrees with is redrawn
like any other position. A finished canvas's kept drafts are thus the
argmax of two consecutive passes. The gain is fewer denoising passes per
canvas: the official canvas cannot pass the stability check until one
step's entropy budget accepts (nearly) every position, while here one
step whose drafts are confident enough suffices.

The verification is the stability check, so early_stop must be
"chained" or "token_stability". gamma > 1 keeps no draft: the official
sampler's tokens bit for bit. gamma is row data (RowSampling.gamma_B,
row_options.py) like the family's other numeric options.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma import canvas_options as co
from flash_dllm_jax.architectures.diffusion_gemma import sampler_steps as st
from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.sampling import commit_rules
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.state import DecodeState


def accept(shaped_BxCxV, keys_B, entropy_bound_B, gamma_B, n_ids: int):
  """[B, C] the next canvas: the official step's draws (st.draws, same
  random calls) where the entropy bound accepts them or their probability
  under the shaped logits is >= the row's gamma_B, uniform noise
  elsewhere."""
  denoised_BxC, accepted_BxC, noise_BxC = st.draws(
      shaped_BxCxV, keys_B, entropy_bound_B, n_ids)
  prob_BxC = jnp.exp(st.token_logprob(shaped_BxCxV, denoised_BxC))
  kept_BxC = accepted_BxC | (prob_BxC >= jnp.reshape(gamma_B, (-1, 1)))
  return jnp.where(kept_BxC, denoised_BxC, noise_BxC)


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaFlashSampler(DiffusionGemmaSampler):
  """DiffusionGemmaSampler (its options, names and defaults) plus gamma:
  the probability a draft the entropy bound rejects needs to stay in the
  canvas for the next pass to verify (module docstring)."""

  gamma: float = option(0.9, "the probability a draft the entropy bound "
                        "rejects needs to stay in the canvas, verified by "
                        "the next pass (> 1: none stays, the official "
                        "sampler)", gt=0.5)
  row_fields: ClassVar[tuple[str, ...]] = co.ROW_FIELDS + ("gamma",)

  def _joint_errors(self) -> list[str]:
    errors = super()._joint_errors()
    try:
      stability, _ = st.parse_early_stop(self.early_stop)
    except ValueError:
      return errors  # named by the base checks
    if not stability:
      errors.append(f"early_stop {self.early_stop!r}: diffusion-gemma-flash "
                    "verifies its kept drafts with the token-stability "
                    "check (early_stop chained or token_stability)")
    return errors

  def _accept(self, shaped, keys_B, opts, state: DecodeState, n_ids: int):
    gamma_B = commit_rules.row_value(state, "gamma", self.gamma)
    gamma_B = jnp.broadcast_to(gamma_B, keys_B.shape)
    return accept(shaped, keys_B, opts.entropy_bound_B, gamma_B, n_ids)
