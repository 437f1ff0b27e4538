"""A synthetic GSM8K-like corpus: multi-step arithmetic word problems.

Each problem is a GSM8K row {"question", "answer"} whose answer is a worked
solution of 2-6 steps with `<<expr=value>>` calculator annotations and a last
line `#### N` (N a positive integer), plus "template" and "steps" fields.

Splits: train problems come from TRAIN_TEMPLATES with TRAIN_NAMES; test
problems from a different seed stream, with TEST_NAMES (disjoint from the
train names, so no test question occurs in train) and a mix of the train
templates and HELD_OUT_TEMPLATES that train never uses. Problem i of a split
depends only on (split, seed, i): deterministic, and independent of how many
problems are generated.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

from flash_dllm_jax.data import templates_counting as counting
from flash_dllm_jax.data import templates_money as money
from flash_dllm_jax.data.gsm_format import Reject, Solution, check_solution
from flash_dllm_jax.data.problem_kit import TEST_NAMES, TRAIN_NAMES, Draw

Template = Callable[[Draw], tuple[str, Solution]]
TRAIN_TEMPLATES: dict[str, Template] = {
    "shopping": money.shopping, "savings": money.savings,
    "wages": money.wages, "discount": money.discount, "sales": money.sales,
    "reading": counting.reading, "baking": counting.baking,
    "travel": counting.travel, "classroom": counting.classroom,
    "ages": counting.ages, "fruit": counting.fruit,
    "collection": counting.collection, "chores": counting.chores,
}
HELD_OUT_TEMPLATES: dict[str, Template] = {
    "party": money.party, "garden": money.garden, "tank": counting.tank,
    "basketball": counting.basketball,
}
ALL_TEMPLATES = {**TRAIN_TEMPLATES, **HELD_OUT_TEMPLATES}
SPLITS = ("train", "test")
MIN_STEPS, MAX_STEPS = 2, 6
_MAX_DRAWS = 500

__all__ = ["ALL_TEMPLATES", "HELD_OUT_TEMPLATES", "SPLITS", "TRAIN_TEMPLATES",
           "check_solution", "generate", "make_problem", "read_jsonl",
           "write_jsonl"]


def make_problem(template: str, rng: random.Random,
                 names=TRAIN_NAMES) -> dict:
  """One problem of `template` drawn from `rng` (redrawn until every step is
  a positive integer and the step count is 2-6)."""
  if template not in ALL_TEMPLATES:
    raise ValueError(f"unknown template {template!r}; expected one of "
                     f"{sorted(ALL_TEMPLATES)}")
  for _ in range(_MAX_DRAWS):
    try:
      question, solution = ALL_TEMPLATES[template](Draw(rng, names))
    except Reject:
      continue
    if MIN_STEPS <= solution.num_steps <= MAX_STEPS:
      return {"question": question, "answer": solution.text(),
              "template": template, "steps": solution.num_steps}
  raise RuntimeError(f"template {template!r} found no valid problem in "
                     f"{_MAX_DRAWS} draws (a template bug)")


def generate(n: int, seed: int = 0, split: str = "train",
             held_out_fraction: float = 0.5) -> list[dict]:
  """`n` problems of `split` ('train' or 'test').

  held_out_fraction: the share of test problems drawn from
  HELD_OUT_TEMPLATES (the rest use train templates, with test names).
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"n must be an int >= 0, got {n!r}")
  if not 0.0 <= held_out_fraction <= 1.0:
    raise ValueError(f"held_out_fraction must be in [0, 1], got "
                     f"{held_out_fraction}")
  train_names, held_names = sorted(TRAIN_TEMPLATES), sorted(HELD_OUT_TEMPLATES)
  problems = []
  for i in range(n):
    # A string seed is hashed with SHA-512: stable across runs and platforms.
    rng = random.Random(f"synthetic-gsm/{split}/{seed}/{i}")
    if split == "train":
      template, names = rng.choice(train_names), TRAIN_NAMES
    else:
      pool = (held_names if rng.random() < held_out_fraction
              else train_names)
      template, names = rng.choice(pool), TEST_NAMES
    problems.append(make_problem(template, rng, names))
  return problems


def write_jsonl(path: str | Path, problems: list[dict]) -> None:
  """Writes one JSON object per line (GSM8K's layout), atomically."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".partial")
  with open(tmp, "w", encoding="utf-8") as f:
    for row in problems:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  tmp.replace(path)


def read_jsonl(path: str | Path) -> list[dict]:
  """Rows of a GSM8K-format .jsonl file (each with question and answer)."""
  from flash_dllm_jax.eval.tasks import read_jsonl as read_rows
  return read_rows(path, ("question", "answer"), "synthetic GSM")


def write_splits(out_dir: str | Path, n_train: int, n_test: int,
                 seed: int = 0, test_seed: int | None = None,
                 held_out_fraction: float = 0.5) -> dict:
  """Writes OUT/train.jsonl, OUT/test.jsonl and OUT/info.json; returns the
  info (sizes, seeds, template lists)."""
  out = Path(out_dir)
  test_seed = seed + 1 if test_seed is None else test_seed
  train = generate(n_train, seed, "train")
  test = generate(n_test, test_seed, "test", held_out_fraction)
  write_jsonl(out / "train.jsonl", train)
  write_jsonl(out / "test.jsonl", test)
  info = {"train": n_train, "test": n_test, "seed": seed,
          "test_seed": test_seed, "held_out_fraction": held_out_fraction,
          "train_templates": sorted(TRAIN_TEMPLATES),
          "held_out_templates": sorted(HELD_OUT_TEMPLATES)}
  (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
  return info
