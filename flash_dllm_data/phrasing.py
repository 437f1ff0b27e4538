"""Phrasing variants of worked-solution steps: the entropy of real text.

With one fixed wording per template a model learns solutions that are
certain token by token, and every confidence-driven decoder sees only
confidences near 0 or 1. Real solutions vary in wording. `Varied` gives each
step two independent, meaning-preserving choices, skewed so that the usual
wording has probability MAJORITY (0.85):

  opener   "" / "So, " / "Then " before the step (1-2 extra tokens, so every
           later position shifts with the choice),
  order    the terms of a pure sum or product in the written order, or
           reversed ("6*7" / "7*6"; the value is the same).

A decoder that sees such a step with its choice still masked is about 0.85
sure of the usual wording and of every token that depends on it: below a
0.9 commit threshold, above a 0.8 verify level. Once the choice is known the
rest of the step is certain again. That is the regime Flash-Verify is built
for (drafts below the threshold that the model confirms together).
"""

from __future__ import annotations

import random
import re

from flash_dllm_data.problem_kit import TEST_NAMES, TRAIN_NAMES

PHRASINGS = ("fixed", "varied")
MAJORITY = 0.85
OPENERS = (("", MAJORITY), ("So, ", 0.10), ("Then ", 0.05))
_NAMES = frozenset(p.name for p in TRAIN_NAMES + TEST_NAMES)
_PURE_SUM = re.compile(r"[0-9]+(?:\+[0-9]+)+")
_PURE_PRODUCT = re.compile(r"[0-9]+(?:\*[0-9]+)+")


def check_phrasing(phrasing: str) -> str:
  """`phrasing` itself, or one ValueError naming the accepted ones."""
  if phrasing not in PHRASINGS:
    raise ValueError(f"phrasing must be one of {PHRASINGS}, got {phrasing!r}")
  return phrasing


class Varied:
  """vary(text, expr) for `Solution.text`, drawing from `rng`."""

  def __init__(self, rng: random.Random):
    self.rng = rng

  def __call__(self, text: str, expr: str) -> tuple[str, str]:
    openers, weights = zip(*OPENERS)
    opener = self.rng.choices(openers, weights=weights)[0]
    reverse = self.rng.random() >= MAJORITY
    first_word = text.split(" ", 1)[0]
    if opener and first_word.lower() != opener.strip(", ").lower():
      if first_word not in _NAMES:
        text = text[:1].lower() + text[1:]
      text = opener + text
    if reverse and (_PURE_SUM.fullmatch(expr) or _PURE_PRODUCT.fullmatch(expr)):
      op = "+" if "+" in expr else "*"
      expr = op.join(reversed(expr.split(op)))
    return text, expr
