"""temperature / top_p / top_k, each declared once: meaning, range, default.

The one source of these settings' ranges. `Sampling` (a row's settings),
the samplers that take them as options (LLaDA, Dream, LLaDA2: their CLI
flags, whose help text comes from here, and lm-eval's model_args) check a
value with `error`; the server's request fields take their pydantic bounds
from `bounds` (serve/protocol.py). A sampler option left None is the
setting's default (off).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

INT32_MAX = 2**31 - 1  # RowSampling holds top_k as int32


@dataclasses.dataclass(frozen=True)
class DrawSetting:
  """name; type: float (any finite real) or int (no bool); default: off;
  ge / gt / le / lt: the bounds (None: none)."""

  name: str
  type: type
  default: float | int
  meaning: str
  ge: float | None = None
  gt: float | None = None
  le: float | None = None
  lt: float | None = None

  def bounds(self) -> dict[str, float]:
    """The bounds as keywords (pydantic's Field(ge=..., le=...))."""
    return {k: v for k in ("ge", "gt", "le", "lt")
            if (v := getattr(self, k)) is not None}

  def range_text(self) -> str:
    lo = "(-inf" if self.ge is None and self.gt is None else (
        f"[{self.ge}" if self.ge is not None else f"({self.gt}")
    hi = "inf)" if self.le is None and self.lt is None else (
        f"{self.le}]" if self.le is not None else f"{self.lt})")
    return f"{lo}, {hi}"

  def error(self, value) -> str | None:
    """Why `value` is not a valid setting (its type, finite, in range)."""
    if self.type is int:
      ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
      ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))
    ok = ok and all(cmp(value, bound) for cmp, bound in (
        (lambda v, b: v >= b, self.ge), (lambda v, b: v > b, self.gt),
        (lambda v, b: v <= b, self.le), (lambda v, b: v < b, self.lt))
                    if bound is not None)
    what = "an int" if self.type is int else "a number"
    return None if ok else (f"{self.name} must be {what} in "
                            f"{self.range_text()}, got {value!r}")

  def help(self) -> str:
    """The CLI flag's help: meaning, range and default."""
    return (f"{self.meaning}; {self.type.__name__} in {self.range_text()}, "
            f"default {self.default!r}")


TEMPERATURE = DrawSetting(
    "temperature", float, 0.0,
    "0: greedy; above 0: sample from softmax(logits / temperature)",
    ge=0, le=2)
TOP_P = DrawSetting(
    "top_p", float, 1.0,
    "sample from the likeliest tokens holding this probability mass; 1: off",
    gt=0, le=1)
TOP_K = DrawSetting(
    "top_k", int, 0,
    "sample from the k likeliest tokens; 0 or -1: off; a k past the "
    "vocabulary: every token", ge=-1, le=INT32_MAX)

SETTINGS: dict[str, DrawSetting] = {
    s.name: s for s in (TEMPERATURE, TOP_P, TOP_K)}


def errors(obj) -> list[str]:
  """An error for each draw setting `obj` (a Sampling or a sampler) holds
  that is neither None nor valid."""
  return [why for name, setting in SETTINGS.items()
          if (value := getattr(obj, name, None)) is not None
          and (why := setting.error(value))]
