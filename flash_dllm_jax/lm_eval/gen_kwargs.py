"""A generate_until request's own temperature (its gen_kwargs) as its
row's sampling settings.

lm-eval's `do_sample: false` is temperature 0 (as its vLLM model reads
it); otherwise the request's `temperature`, if any. It decodes that row
unless model_args state the temperature themselves (`temperature`, or an
option the family says states it: DiffusionGemma's max_temperature),
which then hold for every row. The family maps it as everywhere else:
a sampler with `draw_options` (DiffusionGemma: onto its annealing) takes
the options that function gives, any other sampler the row temperature
of its own sampling rule (row_sampling.Sampling).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flash_dllm_jax.sampling import draw_settings
from flash_dllm_jax.sampling.row_sampling import GREEDY, Sampling


def temperature_of(gen_kwargs: Mapping[str, Any], i: int) -> float | None:
  """Request i's temperature (do_sample false: 0), or None; ValueError
  naming the request for a value out of the setting's range."""
  if gen_kwargs.get("do_sample") is False:
    return 0.0
  value = gen_kwargs.get("temperature")
  if value is None:
    return None
  if why := draw_settings.TEMPERATURE.error(value):
    raise ValueError(f"request {i}: gen_kwargs {why}")
  return float(value)


def states_temperature(sampler, given: Mapping[str, Any]) -> bool:
  """Whether the options `given` (model_args) state the temperature."""
  names = ("temperature",
           *getattr(sampler, "draw_stated", {}).get("temperature", ()))
  return any(given.get(k) is not None for k in names)


def row(sampler, given: Mapping[str, Any], base: Sampling | None,
        temperature: float | None) -> Sampling | None:
  """The row's Sampling for `sampler` (built from options `given`; base:
  every row's Sampling from them, None: the sampler's own) at a request's
  temperature; `base` where the request has none, model_args state one,
  or it changes nothing."""
  if temperature is None or states_temperature(sampler, given):
    return base
  own = base or (sampler.own_sampling() if hasattr(sampler, "own_sampling")
                 else GREEDY)
  if callable(getattr(sampler, "draw_options", None)):
    values = sampler.draw_options(given, temperature=temperature)
    changes = {k: v for k, v in values.items() if v != getattr(sampler, k)}
  else:
    changes = ({} if own.temperature == temperature
               else {"temperature": temperature})
  return dataclasses.replace(own, **changes) if changes else base
