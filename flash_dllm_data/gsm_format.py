"""GSM8K-format worked solutions: building them and checking them.

A solution is lines of prose with calculator annotations, as in GSM8K:

  Tom pays 3*12 = $<<3*12=36>>36 for the pens.
  #### 36

`Solution` builds such text from exact arithmetic (fractions, so no float
error can slip in); `check_solution` re-evaluates every `<<expr=value>>` and
checks that the final `#### N` is the last computed value.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Callable

ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>=]+)>>")
FINAL = re.compile(r"^####\s*(\S+)\s*$")
PLACEHOLDER = "@"  # where a step's calculation goes in its line of prose
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
# What templates write: unsigned integers joined by + - * / (no spaces or
# parentheses). Such expressions take a fast exact path (`_exact_int`).
_NUMBER = r"(?:0|[1-9][0-9]*)"  # no leading zeros: Python rejects "07"
_FLAT_INT_EXPR = re.compile(rf"{_NUMBER}(?:[-+*/]{_NUMBER})*")
_FLAT_TOKENS = re.compile(r"[0-9]+|[-+*/]")


class Reject(Exception):
  """A draw broke a template's constraint (fraction, negative, zero):
  the generator draws again."""


def _exact_int(expr: str) -> Fraction | int | None:
  """The exact value of a flat integer expression ('12*5/100+3'), with the
  usual precedence (* and / before + and -, each left to right), as an int
  when it is whole, else a Fraction; None for any other text (the general
  path evaluates it). Exact arithmetic, so equal to that path's value."""
  if _FLAT_INT_EXPR.fullmatch(expr) is None:
    return None
  tokens = _FLAT_TOKENS.findall(expr)
  total: Fraction | int = 0
  sign, term = 1, int(tokens[0])
  for i in range(1, len(tokens), 2):
    op, x = tokens[i], int(tokens[i + 1])
    if op == "*":
      term = term * x
    elif op == "/":
      if x == 0:
        raise ValueError(f"division by zero in {expr!r}")
      term = term // x if term % x == 0 else Fraction(term, x)
    else:
      total, sign, term = total + sign * term, 1 if op == "+" else -1, x
  total = total + sign * term
  if isinstance(total, Fraction) and total.denominator == 1:
    return total.numerator
  return total


def evaluate(expr: str) -> Fraction:
  """Exact value of an arithmetic expression of numbers, + - * / and
  parentheses (GSM8K's calculator language). Raises ValueError otherwise."""
  fast = _exact_int(expr)
  if fast is not None:
    return Fraction(fast)
  try:
    tree = ast.parse(expr.strip(), mode="eval")
  except SyntaxError:
    raise ValueError(f"not an arithmetic expression: {expr!r}") from None

  def walk(node) -> Fraction:
    if isinstance(node, ast.Expression):
      return walk(node.body)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
      right = walk(node.right)
      if isinstance(node.op, ast.Div) and right == 0:
        raise ValueError(f"division by zero in {expr!r}")
      return _OPS[type(node.op)](walk(node.left), right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
      return -walk(node.operand)
    if (isinstance(node, ast.Constant) and type(node.value) in (int, float)):
      return Fraction(str(node.value))
    raise ValueError(f"unsupported element in {expr!r}: {ast.dump(node)}")

  return walk(tree)


def parse_number(text: str) -> Fraction:
  """'36', '$1,080', '2.5' -> exact value (ValueError if not a number)."""
  cleaned = text.replace(",", "").replace("$", "").strip().rstrip(".")
  try:
    return Fraction(cleaned)
  except (ValueError, ZeroDivisionError):
    raise ValueError(f"not a number: {text!r}") from None


def format_number(value: Fraction) -> str:
  """Integers as '36'; other values as a short decimal ('2.5')."""
  if value.denominator == 1:
    return str(value.numerator)
  return format(float(value), "g")


def annotations(answer: str) -> list[tuple[str, str]]:
  """The (expr, value) text of every calculator annotation, in order."""
  return ANNOTATION.findall(answer)


def check_solution(answer: str) -> bool:
  """True iff every `<<expr=value>>` evaluates to its value, the text right
  after it repeats that value, and the last line is `#### N` with N the
  last computed value. Never raises: malformed text is simply False."""
  if not isinstance(answer, str):
    return False
  lines = answer.strip().split("\n")
  final = FINAL.match(lines[-1]) if lines else None
  if final is None or any("####" in line for line in lines[:-1]):
    return False
  last = None
  try:
    for match in ANNOTATION.finditer(answer):
      expr, value_text = match.groups()
      value = parse_number(value_text)
      if evaluate(expr) != value:
        return False
      if not answer[match.end():].startswith(value_text.strip()):
        return False
      last = value
    return last is not None and parse_number(final.group(1)) == last
  except ValueError:
    return False


class Solution:
  """Accumulates the steps of a worked solution with exact arithmetic.

  step(text, expr) evaluates `expr`, puts "expr = <<expr=v>>v" where `text`
  has PLACEHOLDER and returns v as an int. Values that are not positive
  integers raise Reject, so templates only ever state whole, positive
  quantities.
  """

  def __init__(self):
    self.steps: list[tuple[str, str, bool]] = []  # (text, expr, money)
    self.values: list[int] = []

  def step(self, text: str, expr: str, money: bool = False) -> int:
    if text.count(PLACEHOLDER) != 1:
      raise ValueError(f"step text needs exactly one {PLACEHOLDER!r}: {text!r}")
    value = _exact_int(expr)
    if value is None:
      value = evaluate(expr)
    if not isinstance(value, int):
      if value.denominator != 1:
        raise Reject(f"{expr} = {value}")
      value = value.numerator
    if value <= 0:
      raise Reject(f"{expr} = {value}")
    self.steps.append((text, expr, money))
    self.values.append(value)
    return value

  @property
  def num_steps(self) -> int:
    return len(self.values)

  @property
  def final(self) -> int:
    if not self.values:
      raise ValueError("a solution needs at least one step")
    return self.values[-1]

  def text(self, vary: Callable[[str, str], tuple[str, str]] | None = None,
           ) -> str:
    """The GSM8K answer field: the step lines, then '#### N'.

    vary(text, expr) -> (text, expr) may rephrase a step before it is
    written (same value: see `phrasing`); None writes the steps as stated.
    """
    lines = []
    for (text, expr, money), v in zip(self.steps, self.values):
      if vary is not None:
        text, expr = vary(text, expr)
      calc = f"{expr} = {'$' if money else ''}<<{expr}={v}>>{v}"
      lines.append(text.replace(PLACEHOLDER, calc))
    return "\n".join(lines + [f"#### {self.final}"])
