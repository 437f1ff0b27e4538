"""What problem templates draw from: people, items, units, a seeded `Draw`.

A template is `f(d: Draw) -> (question, Solution)`: it draws people, items,
units and numbers from `d` and states every step with `Solution.step`, which
rejects fractional, zero or negative values (the generator then draws again).
"""

from __future__ import annotations

import random
from typing import NamedTuple


class Person(NamedTuple):
  name: str
  he: str   # subject pronoun
  his: str  # possessive
  him: str  # object pronoun


def _people(spec: str) -> tuple[Person, ...]:
  """'Ava:f Liam:m' -> Person tuples."""
  out = []
  for item in spec.split():
    name, sex = item.split(":")
    out.append(Person(name, *(("she", "her", "her") if sex == "f"
                              else ("he", "his", "him"))))
  return tuple(out)


# Train and test problems use disjoint names, so no test question can equal a
# train question.
TRAIN_NAMES = _people(
    "Ava:f Liam:m Emma:f Noah:m Olivia:f James:m Sophia:f Lucas:m Mia:f "
    "Mason:m Amelia:f Ethan:m Harper:f Logan:m Ella:f Jack:m Grace:f Owen:m "
    "Chloe:f Henry:m Zoe:f Leo:m Nora:f Sam:m Ruby:f Ben:m Lily:f Max:m "
    "Hannah:f Omar:m Priya:f Ravi:m Mei:f Kenji:m Sara:f Diego:m Fatima:f "
    "Ivan:m Aisha:f Tom:m")
TEST_NAMES = _people(
    "Beatrice:f Felix:m Greta:f Hugo:m Ingrid:f Jasper:m Keiko:f Luca:m "
    "Marta:f Nico:m Olga:f Pablo:m Rosa:f Tariq:m Vera:f Wade:m")


class Draw:
  """The random choices of one problem: distinct people, items, numbers."""

  def __init__(self, rng: random.Random, names: tuple[Person, ...]):
    self.rng, self._names, self._used = rng, names, set()

  def person(self) -> Person:
    while True:
      p = self.rng.choice(self._names)
      if p.name not in self._used:
        self._used.add(p.name)
        return p

  def int(self, lo: int, hi: int) -> int:
    return self.rng.randint(lo, hi)

  def pick(self, options):
    return self.rng.choice(options)

  def coin(self, p: float = 0.5) -> bool:
    return self.rng.random() < p


STORE_ITEMS = ("notebooks", "pens", "apples", "candles", "mugs", "books",
               "stickers", "socks", "pencils", "oranges", "toy cars", "plates")
FRUITS = ("apples", "oranges", "pears", "plums", "peaches", "lemons")
BAKED = ("cookies", "muffins", "cupcakes", "rolls", "brownies")
FRACTIONS = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}
LENGTHS = (("km", "km per hour"), ("miles", "miles per hour"))
VOLUMES = ("liters", "gallons")


