"""temperature / top_p / top_k, each declared once: meaning, range, default.

The one source of these settings' ranges (an options.Spec each). `Sampling`
(a row's settings) checks a value with `error`; the samplers that take them
as options (LLaDA, Dream, LLaDA2) declare their fields with `field`, so
their checks, CLI flags and lm-eval's model_args read the same Spec; the
server's request fields take their pydantic bounds from `bounds`
(serve/protocol.py). A sampler option left None is the setting's default
(off).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flash_dllm_jax.sampling import options

INT32_MAX = options.INT32_MAX  # RowSampling holds top_k as int32


@dataclasses.dataclass(frozen=True)
class DrawSetting:
  """name; type: float (any finite real) or int (no bool); default: off;
  spec: meaning and bounds."""

  name: str
  type: type
  default: float | int
  spec: options.Spec

  def bounds(self) -> dict[str, float]:
    return self.spec.bounds()

  def range_text(self) -> str:
    return self.spec.range_text(self.type)

  def error(self, value) -> str | None:
    """Why `value` is not a valid setting (its type, finite, in range)."""
    return options.Spec(**{**vars(self.spec), "none": None}).error(
        self.name, self.type, value)

  def help(self) -> str:
    """The CLI flag's help: meaning, range and default."""
    return self.spec.help(self.type, self.default)

  def field(self, default: Any = None) -> Any:
    """A sampler field taking this setting (default None: off)."""
    spec = self.spec if default is not None else dataclasses.replace(
        self.spec, none=f"off ({self.default!r})")
    return dataclasses.field(default=default, metadata={"option": spec})


TEMPERATURE = DrawSetting("temperature", float, 0.0, options.Spec(
    "0: greedy; above 0: sample from softmax(logits / temperature)",
    ge=0, le=2))
TOP_P = DrawSetting("top_p", float, 1.0, options.Spec(
    "sample from the likeliest tokens holding this probability mass; 1: off",
    gt=0, le=1))
TOP_K = DrawSetting("top_k", int, 0, options.Spec(
    "sample from the k likeliest tokens; 0 or -1: off; a k past the "
    "vocabulary: every token", ge=-1, le=INT32_MAX))

SETTINGS: dict[str, DrawSetting] = {
    s.name: s for s in (TEMPERATURE, TOP_P, TOP_K)}


def errors(obj) -> list[str]:
  """An error for each draw setting `obj` (a Sampling) holds that is
  neither None nor valid."""
  return [why for name, setting in SETTINGS.items()
          if (value := getattr(obj, name, None)) is not None
          and (why := setting.error(value))]
