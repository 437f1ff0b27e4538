"""DiffusionGemma's numeric canvas options as per-row data.

A row's max_temperature, min_temperature, exponent, entropy_bound,
max_out_length, early_stop and stop_tokens (row_sampling.Sampling, None:
the sampler's own) are resolved on the host into `CanvasOptions` arrays
that ride in `RowSampling.extra`, loaded with the row's prompt by
slots.admit, so one compiled program decodes rows with different values.
canvas_length and max_denoising_steps size arrays: they stay the sampler's
(the server's `--variant`s).

The arrays are built so that a row computes what the official code
computes from Python floats: the temperature span max - min is taken in
float64 on the host (as Python does) before its cast, the exponents 1 (the
default) and 2 take the base and its square as XLA folds the official
constant `x ** 1.0` and `x ** 2.0`, and every bound is the float32 the
official comparison casts to.

Shapes: B rows, C canvas positions, V vocabulary, S = stop_capacity.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flash_dllm_jax.architectures.diffusion_gemma import sampler_steps as st
from flash_dllm_jax.architectures.diffusion_gemma.config import ARCH
from flash_dllm_jax.sampling import draw_settings, options

ROW_FIELDS = ("max_temperature", "min_temperature", "exponent",
              "entropy_bound", "max_out_length", "early_stop", "stop_tokens")
STOP_SLOTS = 16  # a row's stop_tokens at most (or the sampler's own count)


class TokenIds(tuple):
  """A tuple of token ids, also from text ("20,21" or "20 21"), so that the
  option reads the same from Python, the CLI and the server."""

  def __new__(cls, value=()):
    if isinstance(value, str):
      value = [v for v in value.replace(",", " ").split() if v]
    try:
      ids = [int(v) for v in value]
    except (TypeError, ValueError):
      raise ValueError(f"stop_tokens must be token ids, got {value!r}"
                       ) from None
    if any(isinstance(v, bool) or (isinstance(v, float) and v != int(v))
           for v in value) or any(i < 0 for i in ids):
      raise ValueError(f"stop_tokens must be non-negative ids, got {value!r}")
    return super().__new__(cls, ids)


@struct.dataclass
class CanvasOptions:
  """Per row: min_temperature_B and span_B (max - min) float32,
  exponent_B float32, entropy_bound_B float32 (acceptance), max_out_B
  int32, stability_B (token stability required), early_B (any early-stop
  rule), early_entropy_B float32 (the rule's entropy bound, +inf: none),
  stop_BxS int32 (the row's stop_tokens, -1 padded)."""

  min_temperature_B: jax.Array
  span_B: jax.Array
  exponent_B: jax.Array
  entropy_bound_B: jax.Array
  max_out_B: jax.Array
  stability_B: jax.Array
  early_B: jax.Array
  early_entropy_B: jax.Array
  stop_BxS: jax.Array


def resolved(sampler, row) -> dict:
  """{option: value} of a row (a Sampling or None): its own value where
  it states one, else the sampler's."""
  out = {}
  for name in ROW_FIELDS:
    value = None if row is None else getattr(row, name)
    out[name] = getattr(sampler, name) if value is None else value
  return out


def host_arrays(sampler, rows) -> CanvasOptions:
  """numpy CanvasOptions of `rows` (Samplings or None) for `sampler`."""
  cols = {k: [] for k in CanvasOptions.__dataclass_fields__}
  cap = stop_capacity(sampler)
  for row in rows:
    v = resolved(sampler, row)
    stability, entropy = st.parse_early_stop(v["early_stop"])
    stops = list(TokenIds(v["stop_tokens"] or ()))
    cols["min_temperature_B"].append(v["min_temperature"])
    cols["span_B"].append(float(v["max_temperature"])
                          - float(v["min_temperature"]))
    cols["exponent_B"].append(v["exponent"])
    cols["entropy_bound_B"].append(v["entropy_bound"])
    cols["max_out_B"].append(v["max_out_length"])
    cols["stability_B"].append(stability)
    cols["early_B"].append(stability or entropy is not None)
    cols["early_entropy_B"].append(np.inf if entropy is None else entropy)
    cols["stop_BxS"].append(stops + [-1] * (cap - len(stops)))
  types = dict(max_out_B=np.int32, stability_B=bool, early_B=bool,
               stop_BxS=np.int32)
  return CanvasOptions(**{k: np.asarray(v, types.get(k, np.float32))
                          for k, v in cols.items()})


def stop_capacity(sampler) -> int:
  """S: stop ids a row holds (STOP_SLOTS, or the sampler's own count)."""
  return max(STOP_SLOTS, len(sampler.stop_tokens))


def row_value_error(sampler, values: dict) -> str | None:
  """Why a row's values cannot decode in `sampler`'s program (beyond the
  sampler's own checks): max_out_length past the sampler's (it sizes the
  answer), more stop_tokens than a row holds; or None."""
  m = values.get("max_out_length")
  if m is not None and m > sampler.max_out_length:
    return (f"max_out_length {m} exceeds the sampler's max_out_length "
            f"{sampler.max_out_length} (it sizes the answer buffer)")
  stops = values.get("stop_tokens")
  if stops is not None and len(TokenIds(stops)) > stop_capacity(sampler):
    return (f"stop_tokens takes at most {stop_capacity(sampler)} ids per "
            f"row, got {len(TokenIds(stops))}")
  return None


# The generic draw settings (sampling/draw_settings.py) this family maps
# onto its canvas options, with what each means here (the help of the
# CLI's flag for this strategy; the generic range).
DRAW_SPECS = {"temperature": dataclasses.replace(
    draw_settings.TEMPERATURE.spec, meaning=(
        "the annealing's first temperature, max_temperature (0: the "
        "official floor 1e-12, the greedy limit); min_temperature becomes "
        "at most it unless given"))}

# The options that state a draw setting's value themselves (given, they
# win over a default temperature such as an lm-eval task's).
DRAW_STATED = {"temperature": ("max_temperature",)}


def draw_options(sampler, stated: dict, temperature=None, top_p=None,
                 top_k=None) -> dict:
  """The canvas options the generic draw settings set on this family's
  sampler, the one mapping every entry point uses (generate's options and
  the CLI's flags, lm-eval's model_args, a served request's fields).
  temperature T: the annealing's first temperature, max_temperature =
  max(T, min_temperature's declared floor, the official 1e-12: T = 0
  anneals at that floor, the greedy limit); min_temperature, unless
  `stated` (the options given beside T) has it, becomes min(the
  sampler's, that), so the whole schedule stays at or below T. top_p /
  top_k: only off (1; 0 or -1), as the official sampler has neither.
  ValueError, starting with the setting's name, otherwise."""
  for name, value, off in (("top_p", top_p, (1,)), ("top_k", top_k, (0, -1))):
    if value is not None and value not in off:
      raise ValueError(
          f"{name} {value!r}: the {ARCH} family's sampler has no {name} "
          "(the official one has neither top_p nor top_k); use temperature "
          "or its canvas options (max_temperature, min_temperature, "
          "exponent, entropy_bound)")
  if temperature is None:
    return {}
  if why := draw_settings.TEMPERATURE.error(temperature):
    raise ValueError(why)
  if stated.get("max_temperature") is not None:
    raise ValueError("temperature sets max_temperature (the annealing's "
                     "first temperature): give one of them")
  floor = options.declared(type(sampler))["min_temperature"][2].ge
  top = max(float(temperature), floor)
  out = {"max_temperature": top}
  if stated.get("min_temperature") is None:
    out["min_temperature"] = min(sampler.min_temperature, top)
  return out


def temperatures(opts: CanvasOptions, noise_B, dtype):
  """[B] AnnealingTemperatureShaper's temperature at each row's noise
  level: min + (1 - (1 - noise) ** exponent) * (max - min), in dtype."""
  base_B = 1.0 - noise_B.astype(dtype)
  exp_B = opts.exponent_B.astype(dtype)
  power_B = jnp.where(exp_B == 1, base_B, jnp.where(
      exp_B == 2, base_B * base_B, base_B ** exp_B))
  fraction_B = 1.0 - power_B
  return (fraction_B * opts.span_B.astype(dtype)
          + opts.min_temperature_B.astype(dtype)).astype(dtype)


def has_stop(canvas_BxC, opts: CanvasOptions):
  """[B, C] the canvas positions holding one of the row's stop_tokens."""
  return jnp.any(canvas_BxC[:, :, None] == opts.stop_BxS[:, None, :], -1)


def should_stop(shaped_BxCxV, previous_BxC, opts: CanvasOptions):
  """[B] each row's early-stop rule after a step (sampler_steps.
  should_stop with the row's rule): token stability where required AND
  mean entropy <= the row's bound; never for "none"."""
  same_B = jnp.all(jnp.argmax(shaped_BxCxV, axis=-1) == previous_BxC, -1)
  mean_B = jnp.mean(st.token_entropy(shaped_BxCxV), axis=-1)
  return opts.early_B & (same_B | ~opts.stability_B) & (
      mean_B <= opts.early_entropy_B)
