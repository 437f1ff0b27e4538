"""Strategy registry: a CLI name -> a sampler class and the options it fixes.

Data-driven: adding a strategy is one line in SHARED (the strategies that
decode several families), e.g.

  Strategy("fast-dllm-dual", FastDLLMSampler, fixed={"cache": "dual"}),

or, for a family's own sampler, one line in its folder's strategies.py
(architectures/<family>/, named by its SPEC's `strategies`): STRATEGIES
(strategy_registry.py) holds every registered family's, then the shared
ones. Every dataclass field of a sampler that some strategy leaves free
becomes a CLI flag (`--gen-length`, `--threshold`, ...) with the type its
annotation gives and the help its declaration gives (sampling/options.py);
a field every strategy of its sampler fixes (`cache`, `verify`) is no
flag. The sampler checks values against the same declaration.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from flash_dllm_jax import architectures
from flash_dllm_jax.sampling import (ElasticCacheSampler, FastDLLMSampler,
                                     draw_settings, options, row_options)
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.block_flash import LLaDA2FlashSampler
from flash_dllm_jax.sampling.flash_dllm_onepass import FlashDLLMOnePassSampler
from flash_dllm_jax.sampling.row_sampling import Sampling, row_fields
from flash_dllm_jax.sampling.strategy import Strategy
from flash_dllm_jax.strategy_registry import StrategyRegistry

SHARED: tuple[Strategy, ...] = (
    Strategy("threshold", FastDLLMSampler, fixed={"cache": "none"},
             help="semi-AR blocks, a commit rule (--rule), no cache"),
    Strategy("fast-dllm-prefix", FastDLLMSampler, fixed={"cache": "prefix"},
             help="Fast-dLLM prefix cache + a commit rule (--rule)"),
    Strategy("fast-dllm-dual", FastDLLMSampler, fixed={"cache": "dual"},
             help="Fast-dLLM dual cache + a commit rule (--rule)"),
    Strategy("flash-cache", FlashDLLMSampler,
             fixed={"recompute_all": False, "verify": False},
             help="Flash-dLLM's Flash-Cache, threshold decoding, no verify"),
    Strategy("flash-dllm", FlashDLLMSampler,
             fixed={"recompute_all": False, "verify": True},
             help="Flash-dLLM: Flash-Cache + Flash-Verify (gamma, threshold)"),
    Strategy("flash-dllm-onepass", FlashDLLMOnePassSampler,
             fixed={"recompute_all": False, "verify": True},
             help="Flash-dLLM in one forward a step: the verify rows of the "
                  "last step's drafts ride in this step's forward (gamma)"),
    Strategy("flash-cache-confident", FlashDLLMSampler,
             fixed={"recompute_all": False, "verify": False,
                    "window_rule": "confident"},
             help="Flash-Cache decoding the most confident open masks"),
    Strategy("flash-dllm-confident", FlashDLLMSampler,
             fixed={"recompute_all": False, "verify": True,
                    "window_rule": "confident"},
             help="Flash-dLLM decoding the most confident open masks"),
    Strategy("elastic-cache", ElasticCacheSampler,
             fixed={"recompute_all": False},
             help="Elastic-Cache: sliding window, per-layer attention-drift "
                  "refresh (gamma), threshold decoding"),
    Strategy("llada2-flash", LLaDA2FlashSampler,
             help="a block-diffusion family's blocks drafted, then "
                  "Flash-Verify of the rest (gamma; rule threshold or "
                  "factor), exact block cache"),
)


STRATEGIES: dict[str, Strategy] = StrategyRegistry(SHARED)

# Old option names, refused with their new name: `stop` means stop strings
# to OpenAI users; Flash-dLLM's rule for the answer's end is end_rule.
RENAMED = {"stop": "end_rule"}


def renamed_error(name: str, flag: bool = True) -> str | None:
  """The refusal of an old option name, pointing to the new one, or None."""
  if name not in RENAMED:
    return None
  old, new = (flag_name(name), flag_name(RENAMED[name])) if flag else (
      name, RENAMED[name])
  return (f"{old} is now {new} (Flash-dLLM's rule for where the answer "
          "ends); stop strings are the server's request field `stop`")


def sampler_options(cls: type) -> dict[str, tuple[type, Any]]:
  """{field name: (base type, default)} of a sampler dataclass."""
  return {k: (typ, default)
          for k, (typ, default, _) in options.declared(cls).items()}


def row_draws(strategy: Strategy) -> tuple[str, ...]:
  """The draw settings (temperature, top_p, top_k) `strategy` samples per
  row without a field of its own (row data, as the server sends them)."""
  fields = sampler_options(strategy.sampler)
  return tuple(k for k in draw_settings.SETTINGS
               if k not in fields and k in row_fields(strategy.sampler))


def mapped_draws(strategy: Strategy) -> dict[str, options.Spec]:
  """{draw setting: its Spec} of the settings `strategy`'s sampler maps
  onto its own options (its family's `draw_options`: DiffusionGemma's
  temperature onto its annealing); none for the others."""
  return dict(getattr(strategy.sampler, "draw_specs", {}))


def takes(strategy: Strategy, option: str) -> bool:
  """Whether `strategy` takes `option`: a field it leaves free whose
  declared needs its fixed options meet, a row draw setting, or a draw
  setting its sampler maps onto its own options."""
  if option in row_draws(strategy) or option in mapped_draws(strategy):
    return True
  declared = options.declared(strategy.sampler)
  if option not in declared or option in strategy.fixed:
    return False
  spec = declared[option][2]
  return all(strategy.fixed[k] in v for k, v in spec.needs.items()
             if k in strategy.fixed)


def shared_first() -> list[Strategy]:
  """The registry's strategies, the shared ones first (the flags' order)."""
  return sorted(STRATEGIES.values(), key=lambda s: s not in SHARED)


def all_options() -> dict[str, type]:
  """{option: type} of the sampler fields some registered strategy takes
  (the flags, the shared strategies' first); a field every strategy fixes
  is not an option."""
  out: dict[str, type] = {}
  for strategy in shared_first():
    for name, (typ, _) in sampler_options(strategy.sampler).items():
      if name in strategy.fixed:
        continue
      if out.setdefault(name, typ) is not typ:
        raise TypeError(f"sampler option {name!r} has two types: "
                        f"{out[name].__name__} and {typ.__name__}")
  return out


def strategies_taking(option: str) -> list[str]:
  return [s.name for s in STRATEGIES.values() if takes(s, option)]


def refilling() -> list[str]:
  """The strategies whose sampler refills slots (`sampling.Refillable`:
  continuous batching in `generate`, the server and the evaluations)."""
  return [s.name for s in STRATEGIES.values()
          if callable(getattr(s.sampler, "reset_rows", None))
          and "max_refills" in sampler_options(s.sampler)]


def decodes(strategy: Strategy, arch: str) -> bool:
  return strategy.sampler.__name__ in architectures.get(arch).samplers


def archs_of(strategy: Strategy) -> list[str]:
  """The architectures whose checkpoints `strategy` decodes."""
  return [a for a in architectures.names() if decodes(strategy, a)]


def strategies_for(arch: str) -> list[str]:
  """The strategy names that decode checkpoints of `arch`."""
  return [s.name for s in STRATEGIES.values() if decodes(s, arch)]


def flag_name(name: str) -> str:
  return "--" + name.replace("_", "-")


def build(name: str, arch: str, given: Mapping[str, Any]
          ) -> tuple[Any, Sampling | None]:
  """(sampler, every row's Sampling or None) of strategy `name` for a
  checkpoint of `arch` from the options given (the rest keep their
  defaults): temperature / top_p / top_k go to the sampler where it has
  them as fields, else to the rows (as the server sends them). An option
  the strategy does not take, or that has no effect with the others, is a
  ValueError naming it."""
  strategy = STRATEGIES[name] if name in STRATEGIES else None
  draws = row_draws(strategy) if strategy else ()
  rows = {k: v for k, v in given.items() if k in draws and v is not None}
  sampler = build_sampler(name, arch, {k: v for k, v in given.items()
                                       if k not in rows})
  return sampler, (Sampling(**rows) if rows else None)


def build_sampler(name: str, arch: str, given: Mapping[str, Any]):
  """The sampler of strategy `name` for a checkpoint of `arch`, built from
  the options given (the rest keep their defaults); an option the
  strategy does not take or ignores is a ValueError naming it."""
  if name not in STRATEGIES:
    raise ValueError(f"unknown strategy {name!r}; known: "
                     f"{', '.join(sorted(STRATEGIES))}")
  strategy = STRATEGIES[name]
  if not decodes(strategy, arch):
    raise ValueError(f"strategy {name!r} decodes "
                     f"{'/'.join(archs_of(strategy)) or 'no'} "
                     f"checkpoints, not {arch!r}; strategies for {arch!r}: "
                     f"{', '.join(strategies_for(arch))}")
  fields = sampler_options(strategy.sampler)
  free = sorted(k for k in fields if takes(strategy, k))
  free += sorted(mapped_draws(strategy))
  maps = callable(getattr(strategy.sampler, "draw_options", None))
  draws = {k: v for k, v in given.items() if maps
           and k in draw_settings.SETTINGS and v is not None}
  given = {k: v for k, v in given.items() if k not in draws}
  for old in set(given) & set(RENAMED):
    raise ValueError(renamed_error(old))
  unknown = sorted(set(given) - set(all_options()))
  if unknown:
    raise ValueError(f"unknown option(s) {', '.join(unknown)} for strategy "
                     f"{name!r}; it takes: {', '.join(free)}")
  foreign = sorted(k for k in given if k not in free)
  if foreign:
    per_row = [k for k in foreign if k in row_draws(strategy)]
    hint = (f"; it samples {', '.join(per_row)} per row: the generate "
            "command's flags, the API's `sampling`, a request's fields"
            if per_row else "")
    raise ValueError(f"option(s) {', '.join(map(flag_name, foreign))} do not "
                     f"apply to strategy {name!r} (it takes: "
                     f"{', '.join(free)}){hint}")
  if draws:  # the family's own mapping (its error names the setting)
    base = strategy.sampler(**{**strategy.fixed, **given})
    try:
      mapped = base.draw_options(given, **draws)
      strategy.sampler(**{**strategy.fixed, **given, **mapped})
    except ValueError as e:
      name = next((k for k in draws if str(e).startswith(k)),
                  "temperature")
      raise ValueError(f"{flag_name(name)}: {e}") from None
    given = {**given, **mapped}
  sampler = strategy.sampler(**{**strategy.fixed, **given})
  for key, value in given.items():  # an option with no effect, refused
    why = None if value is None else options.ignored(sampler, key)
    if why is None and key in row_options.options(sampler):
      why = row_options.off_reason(sampler, key)
    if why:
      raise ValueError(f"{flag_name(key)} has no effect with strategy "
                       f"{name!r}: {why}")
  return sampler


def option_type_error(value, typ: type) -> str | None:
  """Why a value (a request's JSON) is not of a sampler option's type:
  strict, no strings or booleans for numbers, finite floats; or None."""
  if typ is bool:
    ok = isinstance(value, bool)
  elif typ is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif typ is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)
  else:
    ok = isinstance(value, typ)
  what = {float: "a finite number", int: "an int"}.get(
      typ, f"a {typ.__name__}")
  return None if ok else f"must be {what}, got {value!r}"
