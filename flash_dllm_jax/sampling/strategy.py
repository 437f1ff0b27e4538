"""A strategy: a CLI name for a sampler class and the options it pins.

The shared strategies are listed in flash_dllm_jax/strategies.py; a family
with its own sampler lists its strategies in its folder
(architectures/<family>/strategies.py, named by its SPEC's `strategies`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Strategy:
  """name: the CLI name; sampler: a frozen sampler dataclass; fixed:
  options the strategy pins; help: one line. It decodes the architectures
  that name its sampler (Architecture.samplers)."""

  name: str
  sampler: type
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  help: str = ""
