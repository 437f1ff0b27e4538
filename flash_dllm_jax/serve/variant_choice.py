"""Which compiled variant decodes a request (`pick`: the first whose
options equal every option it states) and the decoding options that are
the row's own data (`row_values`: row_options.py), each a BadRequest
naming the field at fault otherwise. A sampler with `draw_options`
(DiffusionGemma) takes the request's `temperature` as its own options (its
family's one mapping onto its annealing; top_p / top_k refused there) and
`max_tokens` as its row's max_out_length."""

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
_TOP_LEVEL_NAMES = tuple(name for name, _ in _TOP_LEVEL)
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
  mapped = set(_TOP_LEVEL_NAMES) if hasattr(samplers[0], "draw_options") \
      else set()
  stated = [
      (name, top_k if name == "top_k" else getattr(req, name), name, absent)
      for name, absent in _TOP_LEVEL if getattr(req, name) is not None
      and (name != "top_k" or top_k is not None) and name not in rows
      and name not in mapped]
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
    if value is not None and (why := _type_error(value, types[name][0])):
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


def _type_error(value, typ: type) -> str | None:
  """option_type_error, or for a structured option (stop_tokens' TokenIds)
  why its type refuses the value."""
  if typ in (bool, int, float, str):
    return option_type_error(value, typ)
  if isinstance(value, (str, bool, int, float, dict)):
    return f"must be a list, got {value!r}"
  try:
    typ(value)
  except (TypeError, ValueError) as e:
    return str(e)
  return None


def row_values(req, sampler, max_tokens: int | None = None) -> dict:
  """The request's options that are the row's own data (row_options.py:
  threshold, factor, gamma; DiffusionGemma's canvas options, with the
  request's temperature and max_tokens mapped onto them), or BadRequest
  naming the field where the variant has no such rule or refuses the
  values."""
  out, names = {}, row_options.options(sampler)
  types = sampler_options(type(sampler))
  for name in names:
    value = (req.decoding or {}).get(name)
    if value is None:
      continue
    param = f"decoding.{name}"
    typ = types[name][0] if name in types else float
    if why := _type_error(value, typ):
      raise BadRequest(f"{param} {why}", param)
    out[name] = float(value) if typ is float else value
  where = {name: f"decoding.{name}" for name in out}
  if hasattr(sampler, "draw_options"):  # the family's own mapping
    draws = {name: getattr(req, name) for name in _TOP_LEVEL_NAMES}
    try:
      mapped = sampler.draw_options(out, **draws)
    except ValueError as e:
      param = next((n for n in draws if str(e).startswith(n)),
                   "temperature")
      raise BadRequest(str(e), param) from None
    out.update(mapped)
    where.update({name: "temperature" for name in mapped})
  if max_tokens is not None and "max_out_length" in names:
    # the decode ends at max_tokens: the answer's first tokens are the same
    out["max_out_length"] = min(max_tokens, out.get(
        "max_out_length", sampler.max_out_length))
    where.setdefault("max_out_length", "max_tokens")
  if out and (why := row_options.values_error(sampler, out)):
    param = next((where[n] for n in sorted(where, key=len, reverse=True)
                  if why.startswith(n) or f" {n}" in why
                  or f"({n}" in why), next(iter(where.values())))
    raise BadRequest(f"{param}: {why}", param)
  try:
    Sampling(**out)
  except ValueError as e:
    param = next(iter(where.values()))
    raise BadRequest(f"{param}: {str(e).split(': ', 1)[-1]}",
                     param) from None
  return out
