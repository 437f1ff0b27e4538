"""Architecture registry: one folder per model family.

Each subpackage here (llada/, dream/, llada2/) holds everything of its
family and exports `SPEC`, an `Architecture`: how to read and check its
Hugging Face config.json, its tensor-name table, its chat template and
special tokens, the parts its blocks are made of, its lm-eval mask scheme,
the strategies that decode it and its published shapes. Code asks the
registry (`get(config.arch)`, `for_model_type(hf["model_type"])`) and
never compares names, so a family is added by adding its folder (found at
import) or, from anywhere, by `load_folder(path)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

LIKELIHOOD_MASKS = ("count", "rate")
MASKS = ("full", "block_causal")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """The attention part: q/k/v biases; QK-norm (an RMSNorm over each
  head's dims of q and k before RoPE); RoPE rotated in float32 (else in
  the activation dtype, cos/sin cast to it); mask "full" (bidirectional)
  or "block_causal" (bidirectional inside a decode block, causal across
  blocks: the sampler says the block length)."""

  qkv_bias: bool = False
  qk_norm: bool = False
  rope_in_float32: bool = True
  mask: str = "full"

  def __post_init__(self):
    if self.mask not in MASKS:
      raise ValueError(f"attention mask must be one of {MASKS}, got "
                       f"{self.mask!r}")


@dataclasses.dataclass(frozen=True)
class Architecture:
  """name: ModelConfig.arch. hf_model_types: config.json `model_type`s it
  reads (lower-cased). label: the HF models, for messages.
  read_hf_config: (config.json dict, tokenizer special ids) -> ModelConfig
    fields (ValueError for unsupported values, KeyError for a missing key).
  name_table: () -> its convert.tables rules.
  attention: the attention part; the MLP is dense, or an MoE where the
    config has `moe` (model/moe.py).
  logits_shift: how many positions earlier the row predicting i sits.
  default_strategy: the strategy `generate` uses when given none;
  samplers: the sampler classes (by name) that decode this family: every
    STRATEGIES entry built on one of them does.
  strategies: None, or () -> the Strategy entries of the family's own
    samplers (in its folder), which strategies.STRATEGIES lists before the
    shared ones.
  chat_template: the genuine checkpoint's template.
  likelihood_masks: how lm-eval's log-likelihood noises the continuation
    (likelihood.py): "count" (exactly x of L tokens, LLaDA's
    eval) or "rate" (each token at a rate, Dream's adapter).
  presets: {name: ModelConfig fields} of published models' shapes.
  tiny_changes: ModelConfig fields of its test models (numerics, an MoE);
  tiny_special_tokens / tiny_tokenizer_config / tiny_bos_is_eos: its tiny
    tokenizer (tokenizer.build_tiny_tokenizer).
  loader: None (checkpoints in this engine's layout or Hugging Face's,
    through ModelConfig), or () -> a module with `claims(dir)`,
    `load_config(dir)` and `load(dir, dtype=, mesh=, quantize=, ...)` for a
    family whose checkpoints and config are its own (flash_dllm_jax.
    checkpoint asks it first).
  """

  name: str
  hf_model_types: tuple[str, ...]
  label: str
  read_hf_config: Callable[..., dict[str, Any]]
  name_table: Callable[[], tuple]
  attention: AttentionSpec
  logits_shift: int
  default_strategy: str
  samplers: tuple[str, ...]
  chat_template: str
  likelihood_masks: str
  presets: Mapping[str, Mapping[str, Any]]
  tiny_changes: Mapping[str, Any]
  tiny_special_tokens: tuple[str, ...]
  tiny_tokenizer_config: Mapping[str, Any]
  tiny_bos_is_eos: bool = False
  loader: Callable[[], Any] | None = None
  strategies: Callable[[], tuple] | None = None

  def __post_init__(self):
    if self.likelihood_masks not in LIKELIHOOD_MASKS:
      raise ValueError(f"{self.name}: likelihood_masks must be one of "
                       f"{LIKELIHOOD_MASKS}, got {self.likelihood_masks!r}")


ARCHITECTURES: dict[str, Architecture] = {}


class MissingToken(ValueError):
  """A special token the family needs that neither config.json nor the
  tokenizer names: the tokenizer's problem, reported as such."""


def register(spec: Architecture) -> Architecture:
  """Adds `spec` (a second family of the same name or model_type is an
  error)."""
  if not isinstance(spec, Architecture):
    raise TypeError(f"SPEC must be an Architecture, got {type(spec).__name__}")
  taken = {t for s in ARCHITECTURES.values() if s.name != spec.name
           for t in s.hf_model_types}
  clash = sorted(taken & set(spec.hf_model_types))
  if clash or (spec.name in ARCHITECTURES
               and ARCHITECTURES[spec.name] is not spec):
    raise ValueError(f"architecture {spec.name!r} (model types "
                     f"{spec.hf_model_types}) is already registered")
  ARCHITECTURES[spec.name] = spec
  return spec


def load_folder(path: str | Path) -> Architecture:
  """Imports the architecture folder at `path` (a package whose
  __init__.py defines SPEC) and registers it."""
  path = Path(path).absolute()
  init = path / "__init__.py"
  if not init.is_file():
    raise ValueError(f"{path} is not an architecture folder (no __init__.py)")
  name = f"{__name__}._external.{path.name}"
  module_spec = importlib.util.spec_from_file_location(
      name, init, submodule_search_locations=[str(path)])
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[name] = module
  module_spec.loader.exec_module(module)
  if not hasattr(module, "SPEC"):
    raise ValueError(f"{init} defines no SPEC")
  return register(module.SPEC)


for _info in pkgutil.iter_modules(__path__):
  if _info.ispkg:
    register(importlib.import_module(f"{__name__}.{_info.name}").SPEC)


def names() -> tuple[str, ...]:
  return tuple(ARCHITECTURES)


def get(name: str) -> Architecture:
  """The spec of ModelConfig.arch `name`; ValueError names the known ones."""
  if name not in ARCHITECTURES:
    raise ValueError(f"unknown architecture {name!r}; known: "
                     f"{', '.join(ARCHITECTURES)}")
  return ARCHITECTURES[name]


def for_model_type(model_type) -> Architecture:
  """The spec that reads an HF config.json of this `model_type`."""
  key = str(model_type).lower()
  for spec in ARCHITECTURES.values():
    if key in spec.hf_model_types:
      return spec
  known = "; ".join(f"{', '.join(repr(t) for t in s.hf_model_types)} "
                    f"({s.label})" for s in ARCHITECTURES.values())
  raise ValueError(f"unknown model_type {model_type!r}: expected one of "
                   f"{known}")


def preset(name: str) -> dict[str, Any]:
  """The ModelConfig fields of published shapes `name` (any family's)."""
  for spec in ARCHITECTURES.values():
    if name in spec.presets:
      return {"arch": spec.name, **spec.presets[name]}
  known = sorted(p for s in ARCHITECTURES.values() for p in s.presets)
  raise ValueError(f"unknown preset {name!r}; known: {', '.join(known)}")
