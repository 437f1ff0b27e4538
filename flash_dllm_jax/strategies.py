"""Strategy registry: a CLI name -> a sampler class and the options it fixes.

Data-driven: adding a strategy is one line in STRATEGIES, e.g.

  Strategy("fast-dllm-dual", FastDLLMSampler, fixed={"cache": "dual"}),

and every dataclass field of its sampler that some strategy leaves free
becomes a CLI flag (`--gen-length`, `--threshold`, ...) with the type its
annotation gives; a field every strategy of its sampler fixes (`cache`,
`verify`) is no flag. The sampler's own __post_init__ checks ranges, so a
bad value gets the sampler's error.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from typing import Any, Mapping

from flash_dllm_jax import architectures
from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.architectures.fast_dllm_v2.sampler import (
    FastDLLMV2Sampler)
from flash_dllm_jax.architectures.sdar.sampler import SDARSampler
from flash_dllm_jax.sampling import (DreamSampler, ElasticCacheSampler,
                                     LLaDASampler)
from flash_dllm_jax.sampling import draw_settings, row_options
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.flash_dllm_onepass import FlashDLLMOnePassSampler
from flash_dllm_jax.sampling.llada2 import LLaDA2Sampler
from flash_dllm_jax.sampling.llada2_flash import LLaDA2FlashSampler
from flash_dllm_jax.sampling.llada21 import MODES, LLaDA21Sampler


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
    Strategy("sdar", SDARSampler,
             help="SDAR's block diffusion (remasking_strategy: static or "
                  "dynamic low-confidence, entropy-bounded) over an exact "
                  "cache of finished blocks"),
    Strategy("fast-dllm-v2", FastDLLMV2Sampler,
             help="Fast-dLLM v2's decoding (sub-blocks, confidence "
                  "threshold, optional sub-block cache) over an exact cache "
                  "of finished blocks"),
)}


def _base_type(hint) -> type:
  """int for `int`, `int | None` or Optional[int]."""
  if (isinstance(hint, types.UnionType)
      or typing.get_origin(hint) is typing.Union):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
      raise TypeError(f"unsupported sampler option type {hint}")
    return args[0]
  return hint


def sampler_options(cls: type) -> dict[str, tuple[type, Any]]:
  """{field name: (base type, default)} of a sampler dataclass."""
  hints = typing.get_type_hints(cls)
  return {f.name: (_base_type(hints[f.name]), f.default)
          for f in dataclasses.fields(cls)}


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
  return [s.name for s in STRATEGIES.values()
          if option in sampler_options(s.sampler) and option not in s.fixed]


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


def build_sampler(name: str, arch: str, options: Mapping[str, Any]):
  """The sampler of strategy `name` for a checkpoint of `arch`, built from
  the options given on the command line (the rest keep their defaults)."""
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
  unknown = sorted(set(options) - set(all_options()))
  if unknown:
    raise ValueError(f"unknown option(s) {', '.join(unknown)} for strategy "
                     f"{name!r}; it takes: "
                     f"{', '.join(k for k in fields if k not in strategy.fixed)}")
  foreign = sorted(k for k in options if k not in fields or k in strategy.fixed)
  if foreign:
    flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
    takes = sorted(k for k in fields if k not in strategy.fixed)
    raise ValueError(f"option(s) {flags} do not apply to strategy {name!r} "
                     f"(it takes: {', '.join(takes)})")
  sampler = strategy.sampler(**{**strategy.fixed, **options})
  for key in options:  # a rule option the sampler's rule ignores, refused
    if key in row_options.options(sampler) and \
        (why := row_options.off_reason(sampler, key)):
      raise ValueError(f"--{key.replace('_', '-')} has no effect with "
                       f"strategy {name!r}: {why}")
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


def add_option_flags(parser, title: str = "strategy options") -> None:
  """Adds every option of `all_options` as a flag (`--gen-length`,
  `--threshold`, ...; booleans as --x / --no-x), default None (the
  sampler's own), help naming the strategies that take it."""
  group = parser.add_argument_group(
      title, "sampler fields (defaults: the sampler's own)")
  for name, typ in all_options().items():
    used = "strategies: " + ", ".join(strategies_taking(name))
    if name in draw_settings.SETTINGS:  # meaning and range: one declaration
      used = f"{draw_settings.SETTINGS[name].help()}; {used}"
    flag = "--" + name.replace("_", "-")
    if typ is bool:
      group.add_argument(flag, dest=name, default=None,
                         action=argparse.BooleanOptionalAction,
                         help=used)
    else:
      group.add_argument(flag, dest=name, type=typ, default=None,
                         help=used)


def options_from_args(args) -> dict[str, Any]:
  """The strategy options given on a command line parsed with the flags of
  `add_option_flags`."""
  return {k: getattr(args, k) for k in all_options()
          if getattr(args, k, None) is not None}
