"""Architecture registry: one `Architecture` spec per model family.

Everything that differs between LLaDA and Dream is a field of its spec, in
its own file (llada.py, dream.py): how to read the Hugging Face config.json,
the HF tensor-name table, special tokens and chat template, the default
strategy and the model flags. Code asks the registry (`get(config.arch)`,
`for_model_type(hf["model_type"])`) instead of comparing names, so adding an
architecture is one new file here plus its line in `_MODULES`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping


LIKELIHOOD_MASKS = ("count", "rate")


@dataclasses.dataclass(frozen=True)
class Architecture:
  """name: ModelConfig.arch. hf_model_types: config.json `model_type`s it
  reads (lower-cased). label: the HF models, for messages.
  read_hf_config: HF config.json dict -> ModelConfig fields (raises
  ValueError for unsupported values, KeyError for a missing key).
  name_table: () -> the convert.tables rules (imported lazily).
  default_strategy: the STRATEGIES entry `generate` uses when given none.
  chat_template: the genuine checkpoint's template.
  qkv_bias, rope_in_float32, logits_shift: the model flags (see ModelConfig).
  likelihood_masks: how lm-eval's log-likelihood noises the continuation
    (lm_eval/likelihood.py): "count" (exactly x of L tokens, LLaDA's
    eval) or "rate" (each token at a rate, Dream's adapter).
  tiny_*: what `ModelConfig.tiny` and `build_tiny_tokenizer` use for test
  fixtures in this format; tiny_bos_is_eos: the model config's BOS is EOS.
  """

  name: str
  hf_model_types: tuple[str, ...]
  label: str
  read_hf_config: Callable[[dict[str, Any]], dict[str, Any]]
  name_table: Callable[[], tuple]
  default_strategy: str
  chat_template: str
  qkv_bias: bool
  rope_in_float32: bool
  logits_shift: int
  likelihood_masks: str
  tiny_numerics: Mapping[str, float]
  tiny_special_tokens: tuple[str, ...]
  tiny_tokenizer_config: Mapping[str, Any]
  tiny_bos_is_eos: bool = False

  def __post_init__(self):
    if self.likelihood_masks not in LIKELIHOOD_MASKS:
      raise ValueError(f"{self.name}: likelihood_masks must be one of "
                       f"{LIKELIHOOD_MASKS}, got {self.likelihood_masks!r}")


_MODULES = ("llada", "dream")
ARCHITECTURES: dict[str, Architecture] = {}
for _module in _MODULES:
  _spec = importlib.import_module(f"{__name__}.{_module}").SPEC
  ARCHITECTURES[_spec.name] = _spec


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
