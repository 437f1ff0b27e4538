"""GSM8K scores under lm-eval's rules, computed without lm-eval.

lm-eval's gsm8k task scores an output twice: `strict-match` takes the first
match of '#### (-?[0-9.,]+)', `flexible-extract` the last match of
'(-?[$0-9.,]{2,})|(-?[0-9]+)' (its first non-empty group); no match gives
'[invalid]'. exact_match then compares the stripped extraction with the
dataset answer after deleting ',', '$', everything up to the last '#### '
and one trailing '.' from both, case-insensitively. The project's own score
(eval/tasks/gsm8k.py: '####' else the last number, numerically normalized)
differs, e.g. '1,080.00' vs '1080'; these functions give lm-eval's numbers
from the project's records.
"""

from __future__ import annotations

import re
from typing import Iterable

INVALID = "[invalid]"
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")


def strict_extract(text: str) -> str:
  found = STRICT.findall(text)
  return found[0].strip() if found else INVALID


def flexible_extract(text: str) -> str:
  found = FLEXIBLE.findall(text)
  if not found:
    return INVALID
  groups = [g for g in found[-1] if g]
  return groups[0].strip() if groups else INVALID


def _normalize(text: str) -> str:
  for pattern in IGNORED:
    text = re.sub(pattern, "", text)
  return text.lower()


def exact_match(prediction: str, reference: str) -> bool:
  return _normalize(prediction) == _normalize(reference)


def score(output: str, answer: str) -> dict[str, bool]:
  """{'strict-match': ..., 'flexible-extract': ...} of one output against
  the dataset's answer text (with its '#### N' line)."""
  return {"strict-match": exact_match(strict_extract(output), answer),
          "flexible-extract": exact_match(flexible_extract(output), answer)}


def accuracy(pairs: Iterable[tuple[str, str]]) -> dict[str, float]:
  """Mean of `score` over (output, answer) pairs, per filter."""
  scores = [score(o, a) for o, a in pairs]
  if not scores:
    raise ValueError("no outputs to score")
  return {k: sum(s[k] for s in scores) / len(scores) for k in scores[0]}
