"""Sampler options that are row data (`Sampling` / `RowSampling` fields).

The rule options a sampler lists in its `row_fields` (row_sampling.py)
are numeric options that change neither shapes nor compiled control flow,
only values its rule compares with:
  threshold  the threshold rule's confidence level (rule "threshold";
             LLaDA2's confidence threshold);
  factor     Fast-dLLM's factor rule (rule "factor");
  gamma      Flash-Verify's acceptance level (Flash-dLLM with verify,
             llada2-flash), Elastic-Cache's attention-drift level, or
             the probability diffusion-gemma-flash keeps a draft at;
  max_temperature, min_temperature, exponent, entropy_bound,
  max_out_length, early_stop, stop_tokens
             DiffusionGemma's canvas options (its sampler's `row_arrays`
             holds them per row; max_out_length at most the sampler's, which
             sizes the answer, stop_tokens at most its `stop_capacity`).
A row's value replaces the sampler's, so the row decodes what
`dataclasses.replace(sampler, option=value, ...)` decodes (a row's values
are checked together, as that call checks them). A value for an option the
sampler has no rule for (or whose rule is off) is an error, and so is a
value the sampler itself refuses. temperature / top_p / top_k are row data
too (row_sampling.py); every other option changes the compiled program:
the server's `--variant`s.
"""

from __future__ import annotations

import dataclasses

from flash_dllm_jax.sampling.row_sampling import row_fields

ROW_OPTIONS = ("threshold", "factor", "gamma", "max_temperature",
               "min_temperature", "exponent", "entropy_bound",
               "max_out_length", "early_stop", "stop_tokens")


def takes_rows(sampler) -> bool:
  """Whether the sampler's decode state carries RowSampling."""
  return bool(row_fields(sampler))


def options(sampler) -> tuple[str, ...]:
  """The rule options `sampler` takes per row (its row_fields among
  ROW_OPTIONS)."""
  return tuple(f for f in row_fields(sampler) if f in ROW_OPTIONS)


def off_reason(sampler, name: str) -> str | None:
  """Why `sampler` has no rule that a row's `name` would change, or None."""
  kind = type(sampler).__name__
  if name not in options(sampler):
    return f"{kind} takes no per-row {name}"
  rule = getattr(sampler, "rule", name)  # LLaDA2: its threshold, no rule
  if name in ("threshold", "factor") and rule != name:
    return f"{name} applies to rule={name!r}, not the sampler's rule {rule!r}"
  if name == "gamma":
    if getattr(sampler, "recompute_all", False):
      return "gamma applies to the cached forward, not recompute_all"
    if not getattr(sampler, "verify", True):
      return f"gamma is the verify pass's level and {kind} runs without verify"
    if rule == "fixed" and hasattr(sampler, "verify"):
      return "gamma: the verify pass accepts nothing under rule='fixed'"
  return None


def value_error(sampler, name: str, value) -> str | None:
  """Why a row's `name` = value cannot decode with `sampler` (the rule is
  off, or the sampler refuses the value), or None."""
  return values_error(sampler, {name: value})


def values_error(sampler, values: dict) -> str | None:
  """Why a row's options `values` cannot decode with `sampler` together
  (an option it takes no row value of, a value its declaration or its
  joint checks refuse, or one past its `row_value_error`), or None."""
  for name in values:
    if reason := off_reason(sampler, name):
      return reason
  try:
    dataclasses.replace(sampler, **values)
  except ValueError as e:  # "invalid ... arguments: <the option's error>"
    return str(e).split(": ", 1)[-1]
  more = getattr(sampler, "row_value_error", None)
  return None if more is None else more(values)


def check_rows(sampler, rows) -> None:
  """One ValueError naming each row (index, options) whose options cannot
  decode with `sampler`; rows: Samplings, or None."""
  if rows is None:
    return
  seen, errors = {}, []
  for i, row in enumerate(rows):
    values = {name: getattr(row, name) for name in ROW_OPTIONS
              if getattr(row, name) is not None}
    if not values:
      continue
    key = repr(sorted(values.items()))
    if key not in seen:
      seen[key] = values_error(sampler, values)
    if seen[key]:
      errors.append(f"sampling[{i}].{'/'.join(values)}: {seen[key]}")
  if errors:
    raise ValueError("invalid per-row options: " + "; ".join(errors[:5]))
