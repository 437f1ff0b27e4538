"""Sampler options, each declared once on its dataclass field.

A sampler field is `options.option(default, meaning, ...)`: its metadata
holds what the option does, its range or choices, what None means (if it
may be None) and the other options it needs to have any effect. From that
one declaration come the samplers' checks (`check`), the CLI flags and
their help (strategies.py), the server's `decoding` fields and lm-eval's
model_args (both through strategies.build_sampler). Checks that tie two
options together (a schedule dividing into blocks) stay in the sampler.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from typing import Any, Mapping

INT32_MAX = 2**31 - 1  # device arrays hold a sampler's ints as int32


@dataclasses.dataclass(frozen=True)
class Spec:
  """meaning: what the option does; ge / gt / le / lt: bounds of a number
  (None: none); choices: the values of a string option; none: what None
  means (None: None is refused); needs: {other option: the values it must
  hold} for this one to have any effect."""

  meaning: str
  ge: float | None = None
  gt: float | None = None
  le: float | None = None
  lt: float | None = None
  choices: tuple[str, ...] = ()
  none: str | None = None
  needs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def bounds(self) -> dict[str, float]:
    """The bounds as keywords (pydantic's Field(ge=..., le=...))."""
    return {k: v for k in ("ge", "gt", "le", "lt")
            if (v := getattr(self, k)) is not None}

  def range_text(self, typ: type) -> str:
    """'in (0, 1]', '> 0', 'a positive int', 'one of (a, b)', ''."""
    if self.choices:
      return f"one of {self.choices}"
    lo = ((">=", self.ge) if self.ge is not None else
          (">", self.gt) if self.gt is not None else None)
    hi = (("<=", self.le) if self.le is not None else
          ("<", self.lt) if self.lt is not None else None)
    if typ is int and lo == (">=", 1) and hi is None:
      return "a positive int"
    if lo and hi:
      text = (f"in {'[' if lo[0] == '>=' else '('}{lo[1]}, "
              f"{hi[1]}{']' if hi[0] == '<=' else ')'}")
    elif lo or hi:
      text = f"{(lo or hi)[0]} {(lo or hi)[1]}"
    else:
      return ""
    return f"an int {text}" if typ is int else text

  def error(self, name: str, typ: type, value) -> str | None:
    """Why `value` is not valid for option `name` of type `typ`, or None."""
    if value is None:
      return None if self.none is not None else \
          f"{name} must not be None{self._expect(typ)}"
    if typ is bool:
      ok = isinstance(value, bool)
    elif typ is int:
      ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    elif typ is float:
      ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    elif typ is str:
      ok = isinstance(value, str)
    else:
      return None  # the sampler checks its own structured options
    if not ok:
      what = {float: "a real number", int: "an int", bool: "a bool",
              str: "a string"}[typ]
      return f"{name} must be {what}{self._expect(typ)}, got {value!r}"
    if typ is float and not math.isfinite(value):
      return f"{name} must be a finite number, got {value!r}"
    if typ is int and abs(value) > INT32_MAX and self.le is None:
      return f"{name} must fit int32 (|x| <= {INT32_MAX}), got {value!r}"
    in_range = all(cmp(value, bound) for cmp, bound in (
        (lambda v, b: v >= b, self.ge), (lambda v, b: v > b, self.gt),
        (lambda v, b: v <= b, self.le), (lambda v, b: v < b, self.lt))
                   if bound is not None)
    if not in_range or (self.choices and value not in self.choices):
      rng = self.range_text(typ)
      if self.none is not None:
        rng = "None or " + (rng if rng.startswith(("a", "one", "in"))
                            else f"a number {rng}")
      return f"{name} must be {rng}, got {value!r}"
    return None

  def _expect(self, typ: type) -> str:
    rng = self.range_text(typ)
    return f" ({rng})" if rng and not rng.startswith(("a ", "an ")) else ""

  def help(self, typ: type, default) -> str:
    """A flag's help: meaning, type and range or choices, default."""
    rng = self.range_text(typ)
    kind = ("" if self.choices or rng.startswith(("a ", "an "))
            else f"{typ.__name__} ")
    parts = [self.meaning, f"{kind}{rng}".strip() or typ.__name__]
    if self.none is not None:
      parts.append(f"None: {self.none}")
    if self.needs:
      parts.append("only with " + ", ".join(
          f"{k} {'/'.join(map(str, v))}"
          for k, v in self.needs.items()))
    return "; ".join(p for p in parts if p) + f"; default {default!r}"


def option(default, meaning: str, **spec) -> Any:
  """A sampler dataclass field declaring its option (Spec's arguments)."""
  return dataclasses.field(default=default,
                           metadata={"option": Spec(meaning, **spec)})


def max_refills(default: int | None = None, also: str = "") -> Any:
  """The one declaration of `max_refills`, which every refillable sampler
  takes (`also`: what more the sampler does with it)."""
  return option(default, "continuous batching: slots that take a new "
                f"request per step{also}", ge=1, none="any number")


def spec_of(field: dataclasses.Field) -> Spec | None:
  return field.metadata.get("option")


def base_type(hint) -> type:
  """int for `int`, `int | None` or Optional[int]."""
  if (isinstance(hint, types.UnionType)
      or typing.get_origin(hint) is typing.Union):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
      raise TypeError(f"unsupported sampler option type {hint}")
    return args[0]
  return hint


def declared(cls: type) -> dict[str, tuple[type, Any, Spec | None]]:
  """{field name: (base type, default, Spec or None)} of a dataclass."""
  return dict(_declared(cls))


@functools.cache
def _declared(cls: type) -> dict[str, tuple[type, Any, Spec | None]]:
  """declared's answer, once per class: the command lines' flags ask it
  about every strategy's sampler thousands of times, and
  typing.get_type_hints costs about 0.2 ms a call (2 s of CPU per parser)."""
  hints = typing.get_type_hints(cls)
  return {f.name: (base_type(hints[f.name]), f.default, spec_of(f))
          for f in dataclasses.fields(cls)}


def errors(obj) -> list[str]:
  """An error per declared field of `obj` whose value is out of its Spec."""
  return [why for name, (typ, _, spec) in declared(type(obj)).items()
          if spec is not None
          and (why := spec.error(name, typ, getattr(obj, name)))]


def check(obj, more=None) -> None:
  """Raises one ValueError 'invalid <Class> arguments: ...' naming every
  field out of its declaration; then, only if all are valid, the errors
  `more()` gives (checks tying options together)."""
  found = errors(obj)
  if not found and more is not None:
    found = list(more())
  if found:
    raise ValueError(f"invalid {type(obj).__name__} arguments: "
                     + "; ".join(found))


def ignored(obj, name: str) -> str | None:
  """Why option `name` has no effect on sampler `obj` (its Spec's needs),
  or None."""
  spec = spec_of(next(f for f in dataclasses.fields(obj) if f.name == name))
  for other, values in (spec.needs if spec else {}).items():
    value = getattr(obj, other)
    if value not in values:
      want = " or ".join(map(repr, values))
      return f"{name} applies only with {other} {want}, not {value!r}"
  return None
