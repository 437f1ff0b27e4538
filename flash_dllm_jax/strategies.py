"""Strategy registry: a CLI name -> a sampler class and the options it fixes.

Data-driven: adding a strategy is one line in STRATEGIES, e.g.

  Strategy("fast-dllm-dual", FastDLLMSampler, fixed={"cache": "dual"}),

and every dataclass field of its sampler that some strategy leaves free
becomes a CLI flag (`--gen-length`, `--threshold`, ...) with the type its
annotation gives and the help its declaration gives (sampling/options.py);
a field every strategy of its sampler fixes (`cache`, `verify`) is no flag.
The sampler checks values against the same declaration.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Mapping

from flash_dllm_jax import architectures
from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.sampling import (DreamSampler, ElasticCacheSampler,
                                     LLaDASampler)
from flash_dllm_jax.sampling import draw_settings, options, row_options
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.flash_dllm_onepass import FlashDLLMOnePassSampler
from flash_dllm_jax.sampling.llada2 import LLaDA2Sampler
from flash_dllm_jax.sampling.llada2_flash import LLaDA2FlashSampler
from flash_dllm_jax.sampling.llada21 import MODES, LLaDA21Sampler
from flash_dllm_jax.sampling.row_sampling import Sampling, row_fields


@dataclasses.dataclass(frozen=True)
class Strategy:
  """name: the CLI name; sampler: a frozen sampler dataclass; fixed:
  options the strategy pins. It decodes the architectures that name its
  sampler (Architecture.samplers)."""

  name: str
  sampler: type
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  help: str = ""


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("llada", LLaDASampler,
             help="LLaDA's reference sampler (semi-AR blocks, no cache)"),
    Strategy("dream", DreamSampler,
             help="Dream's reference sampler (no cache)"),
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
    Strategy("llada2", LLaDA2Sampler,
             help="LLaDA2's block-diffusion sampler (threshold or schedule "
                  "per block) over an exact cache of finished blocks"),
    Strategy("llada2.1", LLaDA21Sampler, fixed={"steps": 32},
             help="LLaDA2.1's decoding: threshold unmasking (M2T) plus "
                  "editing of committed tokens (T2T), exact block cache"),
    Strategy("llada2.1-speed", LLaDA21Sampler,
             fixed={"steps": 32, **MODES["speed"]},
             help="llada2.1 in LLaDA2.1's speed mode (threshold "
                  "0.5, editing_threshold 0.0, max_post_steps 16)"),
    Strategy("llada2.1-quality", LLaDA21Sampler,
             fixed={"steps": 32, **MODES["quality"]},
             help="llada2.1 in LLaDA2.1's quality mode (threshold "
                  "0.7, editing_threshold 0.5, max_post_steps 16)"),
    Strategy("llada2-flash", LLaDA2FlashSampler,
             help="LLaDA2 blocks drafted, then Flash-Verify of the rest "
                  "(gamma; rule threshold or factor), exact block cache"),
    Strategy("diffusion-gemma", DiffusionGemmaSampler,
             help="DiffusionGemma's official canvas sampler (self-"
                  "conditioned denoising, entropy-bound acceptance, early "
                  "stop), over an exact cache of prompt and canvases"),
)}


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


def takes(strategy: Strategy, option: str) -> bool:
  """Whether `strategy` takes `option`: a field it leaves free whose
  declared needs its fixed options meet, or a row draw setting."""
  if option in row_draws(strategy):
    return True
  declared = options.declared(strategy.sampler)
  if option not in declared or option in strategy.fixed:
    return False
  spec = declared[option][2]
  return all(strategy.fixed[k] in v for k, v in spec.needs.items()
             if k in strategy.fixed and v != options.SET)


def all_options() -> dict[str, type]:
  """{option: type} of the sampler fields some registered strategy takes
  (the flags); a field every strategy fixes is not an option."""
  out: dict[str, type] = {}
  for strategy in STRATEGIES.values():
    for name, (typ, _) in sampler_options(strategy.sampler).items():
      if name in strategy.fixed:
        continue
      if out.setdefault(name, typ) is not typ:
        raise TypeError(f"sampler option {name!r} has two types: "
                        f"{out[name].__name__} and {typ.__name__}")
  return out


def strategies_taking(option: str) -> list[str]:
  return [s.name for s in STRATEGIES.values() if takes(s, option)]


def decodes(strategy: Strategy, arch: str) -> bool:
  return strategy.sampler.__name__ in architectures.get(arch).samplers


def archs_of(strategy: Strategy) -> list[str]:
  """The architectures whose checkpoints `strategy` decodes."""
  return [a for a in architectures.names() if decodes(strategy, a)]


def strategies_for(arch: str) -> list[str]:
  """The strategy names that decode checkpoints of `arch`."""
  return [s.name for s in STRATEGIES.values() if decodes(s, arch)]


def _flag(name: str) -> str:
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
  if "stop" in given and "stop" not in fields:
    raise ValueError("--stop (Flash-dLLM's rule for the answer's end) is "
                     "now --end-rule (end_rule); stop strings are the "
                     "server's request field `stop`")
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
    raise ValueError(f"option(s) {', '.join(map(_flag, foreign))} do not "
                     f"apply to strategy {name!r} (it takes: "
                     f"{', '.join(free)}){hint}")
  sampler = strategy.sampler(**{**strategy.fixed, **given})
  for key, value in given.items():  # an option with no effect, refused
    why = None if value is None else options.ignored(sampler, key)
    if why is None and key in row_options.options(sampler):
      why = row_options.off_reason(sampler, key)
    if why:
      raise ValueError(f"{_flag(key)} has no effect with strategy "
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


def _declared(strategy: Strategy, name: str) -> tuple[type, Any, Any]:
  """(type, default, Spec) of option `name` as `strategy` takes it; a row
  draw setting as a sampler field declares it (default: off)."""
  if name in row_draws(strategy):
    setting = draw_settings.SETTINGS[name]
    default = setting.default if name == "temperature" else None
    field = setting.field(default)
    return setting.type, default, field.metadata["option"]
  typ, default, spec = options.declared(strategy.sampler)[name]
  flags = all_options()  # needs on options no flag sets go unsaid
  return typ, default, dataclasses.replace(spec, needs={
      k: v for k, v in spec.needs.items() if k in flags})


def _names(names: list[str]) -> str:
  rest = [n for n in STRATEGIES if n not in names]
  if not rest:
    return "every strategy"
  if len(rest) <= 3 and len(names) > len(rest):
    return f"every strategy but {', '.join(rest)}"
  return ", ".join(names)


def option_help(name: str) -> str:
  """A flag's help from its declarations: each distinct one (meaning,
  range or choices) with its defaults and the strategies it holds for."""
  groups: dict[str, dict[str, list[str]]] = {}
  for strategy in STRATEGIES.values():
    if takes(strategy, name):
      typ, default, spec = _declared(strategy, name)
      text = spec.help(typ, default).rsplit("; default ", 1)[0]
      groups.setdefault(text, {}).setdefault(repr(default), []).append(
          strategy.name)
  out = []
  for text, defaults in groups.items():
    names = [n for ns in defaults.values() for n in ns]
    if len(defaults) == 1:
      default = f"default {next(iter(defaults))}"
    else:
      default = "default " + ", ".join(f"{d} ({_names(ns)})"
                                       for d, ns in defaults.items())
    out.append(f"{text}; {default} [{_names(names)}]")
  return " | ".join(out)


def add_option_flags(parser, title: str = "strategy options") -> None:
  """Adds every option of `all_options` as a flag (`--gen-length`,
  `--threshold`, ...; booleans as --x / --no-x), default None (the
  sampler's own), help from the options' declarations (what each does,
  its range or choices, its default, the strategies that take it)."""
  group = parser.add_argument_group(
      title, "sampler options, each: what it does; range or choices; "
      "default [the strategies it holds for]; an option a strategy does "
      "not take, or that has no effect with the others, is an error")
  for name, typ in all_options().items():
    flag, text = _flag(name), option_help(name).replace("%", "%%")
    if typ is bool:
      group.add_argument(flag, dest=name, default=None,
                         action=argparse.BooleanOptionalAction, help=text)
    else:
      group.add_argument(flag, dest=name, type=typ, default=None, help=text)
  group.add_argument("--stop", dest="stop", default=None,
                     help=argparse.SUPPRESS)  # refused: now --end-rule


def options_from_args(args) -> dict[str, Any]:
  """The strategy options given on a command line parsed with the flags of
  `add_option_flags` (the old --stop included, for build_sampler to
  refuse with its new name)."""
  return {k: getattr(args, k) for k in (*all_options(), "stop")
          if getattr(args, k, None) is not None}
