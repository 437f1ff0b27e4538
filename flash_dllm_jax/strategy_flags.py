"""The command-line flags of the strategy options, from their declarations
(sampling/options.py): one flag per option some registered strategy takes,
its help saying what it does, its range or choices, its default and the
strategies that take it. generate, serve and eval add them."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from flash_dllm_jax.sampling import draw_settings, options
from flash_dllm_jax.sampling.strategy import Strategy
from flash_dllm_jax.strategies import (RENAMED, STRATEGIES, flag_name,
                                       shared_first, all_options,
                                       mapped_draws, row_draws, takes)


def _declared(strategy: Strategy, name: str) -> tuple[type, Any, Any]:
  """(type, default, Spec) of option `name` as `strategy` takes it; a row
  draw setting as a sampler field declares it (default: off); one the
  sampler maps onto its own options as its family declares it (default:
  those options' own)."""
  if name in mapped_draws(strategy):
    return draw_settings.SETTINGS[name].type, None, dataclasses.replace(
        mapped_draws(strategy)[name],
        none="the options it maps onto keep theirs")
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
  for strategy in shared_first():
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
    flag, text = flag_name(name), option_help(name).replace("%", "%%")
    if typ is bool:
      group.add_argument(flag, dest=name, default=None,
                         action=argparse.BooleanOptionalAction, help=text)
    else:
      group.add_argument(flag, dest=name, type=typ, default=None, help=text)
  for old in RENAMED:  # refused by build_sampler with the new name
    group.add_argument(flag_name(old), dest=old, default=None,
                       help=argparse.SUPPRESS)


def options_from_args(args) -> dict[str, Any]:
  """The strategy options given on a command line parsed with the flags of
  `add_option_flags` (old names included, for build_sampler to refuse
  with their new name)."""
  return {k: getattr(args, k) for k in (*all_options(), *RENAMED)
          if getattr(args, k, None) is not None}
