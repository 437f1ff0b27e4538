"""Which compiled variant decodes a request (`pick`: the first whose
options equal every option it states) and the decoding options that are
the row's own data (`row_values`: row_options.py), each a BadRequest
naming the field at fault otherwise."""

from __future__ import annotations

import dataclasses
import math

from flash_dllm_jax.sampling import row_options
from flash_dllm_jax.sampling.row_sampling import Sampling, row_fields
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.strategies import (option_type_error, renamed_error,
                                      sampler_options)

# Request fields that pick a variant besides `decoding`, where the sampler
# does not take them per row (`row_fields`; LLaDA's top_p / top_k): (field,
# the value a sampler without the option decodes with).
_TOP_LEVEL = (("temperature", 0.0), ("top_p", 1.0), ("top_k", None))
_REQUEST_FIELDS = ("temperature", "top_p", "top_k", "seed", "max_tokens",
                   "stop", "n")


def _same(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    return (a is not None and b is not None and not isinstance(a, str)
            and not isinstance(b, str)
            and math.isclose(float(a), float(b), abs_tol=1e-9))
  return a == b


def pick(req, samplers, strategy: str) -> int:
  """The index of the declared variant whose options equal every option
  the request states (the first such), or BadRequest naming the field."""
  top_k = None if req.top_k is None or req.top_k <= 0 else req.top_k
  rows = row_fields(samplers[0])
  stated = [
      (name, top_k if name == "top_k" else getattr(req, name), name, absent)
      for name, absent in _TOP_LEVEL if getattr(req, name) is not None
      and (name != "top_k" or top_k is not None) and name not in rows]
  names = dataclasses.asdict(samplers[0])
  types = sampler_options(type(samplers[0]))  # the CLI flags' types
  for name, value in (req.decoding or {}).items():
    if name not in names and (why := renamed_error(name, flag=False)):
      raise BadRequest(f"decoding.{why}", f"decoding.{name}")
    if name not in names and name in _REQUEST_FIELDS:
      raise BadRequest(f"{name} is a request field, not a decoding "
                       f"option: send it as the request's {name}",
                       f"decoding.{name}")
    if name not in names:
      raise BadRequest(f"unknown decoding option {name!r}; the sampler "
                       f"takes {sorted(names)}", f"decoding.{name}")
    if value is not None and (why := option_type_error(
        value, types[name][0])):
      raise BadRequest(f"decoding.{name} {why}", f"decoding.{name}")
    if name in rows and name not in row_options.ROW_OPTIONS:
      raise BadRequest(f"{name} is a per-request setting: send it as the "
                       f"request's {name} field", f"decoding.{name}")
    if name in rows:
      continue  # the row's own (see `row_values`)
    stated.append((name, value, f"decoding.{name}", None))
  left = list(range(len(samplers)))
  for name, value, param, absent in stated:
    match = [i for i in left if _same(
        getattr(samplers[i], name, absent), value)]
    if not match:
      allowed = sorted({repr(getattr(samplers[i], name, absent))
                        for i in left})
      raise BadRequest(
          f"no variant declared at start decodes with {name}={value!r} "
          f"(strategy {strategy!r}, with the options stated "
          f"before it); allowed: {', '.join(allowed)}", param)
    left = match
  return left[0]


def row_values(req, sampler) -> dict[str, float]:
  """The stated decoding options that are the row's own data
  (row_options.py: threshold, factor, gamma), or BadRequest naming the
  field where the variant has no such rule or refuses the value."""
  out = {}
  for name in row_options.options(sampler):
    value = (req.decoding or {}).get(name)
    if value is None:
      continue
    param = f"decoding.{name}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
        or not math.isfinite(value):
      raise BadRequest(f"{param} must be a finite number, got {value!r}",
                       param)
    if why := row_options.value_error(sampler, name, float(value)):
      raise BadRequest(f"{param}: {why}", param)
    try:
      Sampling(**{name: float(value)})
    except ValueError as e:
      raise BadRequest(f"{param}: {str(e).split(': ', 1)[-1]}",
                       param) from None
    out[name] = float(value)
  return out
