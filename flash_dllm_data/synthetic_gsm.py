"""A synthetic GSM8K-like corpus: multi-step arithmetic word problems.

Each problem is a GSM8K row {"question", "answer"} whose answer is a worked
solution of 2-6 steps with `<<expr=value>>` calculator annotations and a last
line `#### N` (N a positive integer), plus "template" and "steps" fields.

Splits: train problems come from TRAIN_TEMPLATES, uniformly. Test problems
come from a different seed stream and another mix of the same templates
(TEST_MIX weights); write_splits drops any test question that also occurs in
train, so the test set is held out. The "ood" split is a generalisation probe
beyond that: HELD_OUT_TEMPLATES that train never uses, with TEST_NAMES that
train never uses. Problem i of a split depends only on (split, seed, i,
phrasing): deterministic, and independent of how many problems are generated.
Phrasing "varied" (the default) rewords steps at random (`phrasing`); its
questions are those of "fixed", which writes every step as its template does.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

from flash_dllm_data import templates_counting as counting
from flash_dllm_data import templates_money as money
from flash_dllm_data.gsm_format import Reject, Solution, check_solution
from flash_dllm_data.phrasing import PHRASINGS, Varied, check_phrasing
from flash_dllm_data.problem_kit import TEST_NAMES, TRAIN_NAMES, Draw

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
SPLITS = ("train", "test", "ood")
# Relative template weights of the test split (sorted template order).
TEST_MIX = (3, 1, 2, 1, 3, 2, 1, 2, 3, 1, 2, 3, 1)
MIN_STEPS, MAX_STEPS = 2, 6
_MAX_DRAWS = 500
DEFAULT_PHRASING = "varied"

__all__ = ["ALL_TEMPLATES", "DEFAULT_PHRASING", "HELD_OUT_TEMPLATES",
           "PHRASINGS", "SPLITS", "TRAIN_TEMPLATES",
           "TEST_MIX", "check_solution", "draw", "generate", "held_out",
           "make_problem", "read_jsonl", "write_jsonl"]


def make_problem(template: str, rng: random.Random, names=TRAIN_NAMES,
                 phrasing: str = DEFAULT_PHRASING) -> dict:
  """One problem of `template` drawn from `rng` (redrawn until every step is
  a positive integer and the step count is 2-6), its steps worded per
  `phrasing` (the variants are drawn after the problem, so the question does
  not depend on it)."""
  check_phrasing(phrasing)
  if template not in ALL_TEMPLATES:
    raise ValueError(f"unknown template {template!r}; expected one of "
                     f"{sorted(ALL_TEMPLATES)}")
  for _ in range(_MAX_DRAWS):
    try:
      question, solution = ALL_TEMPLATES[template](Draw(rng, names))
    except Reject:
      continue
    if MIN_STEPS <= solution.num_steps <= MAX_STEPS:
      vary = Varied(rng) if phrasing == "varied" else None
      return {"question": question, "answer": solution.text(vary),
              "template": template, "steps": solution.num_steps}
  raise RuntimeError(f"template {template!r} found no valid problem in "
                     f"{_MAX_DRAWS} draws (a template bug)")


def generate(n: int, seed: int = 0, split: str = "train",
             workers: int = 1, phrasing: str = DEFAULT_PHRASING) -> list[dict]:
  """`n` problems of `split`: 'train', 'test' (train templates in the
  TEST_MIX proportions) or 'ood' (held-out templates and names).

  workers > 1 draws index ranges in that many processes (the same problems:
  each depends only on its index)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"n must be an int >= 0, got {n!r}")
  check_phrasing(phrasing)
  if workers > 1 and n >= 2 * workers:
    import concurrent.futures
    import multiprocessing
    bounds = [n * w // workers for w in range(workers + 1)]
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn")) as pool:
      parts = pool.map(_problems, [split] * workers, [seed] * workers,
                       bounds[:-1], bounds[1:], [phrasing] * workers)
      return [p for part in parts for p in part]
  return _problems(split, seed, 0, n, phrasing)


_TRAIN_ORDER, _HELD_ORDER = sorted(TRAIN_TEMPLATES), sorted(HELD_OUT_TEMPLATES)


def draw(split: str, seed: int, index: int, attempt: int = 0,
         phrasing: str = DEFAULT_PHRASING) -> dict:
  """Problem `index` of a split's stream (attempt 0), or its `attempt`-th
  replacement: an independent draw for callers that must skip a problem
  (a held-out question, a row too long) and still have one at `index`."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  # A string seed is hashed with SHA-512: stable across runs and platforms.
  key = f"synthetic-gsm/{split}/{seed}/{index}"
  rng = random.Random(f"{key}/{attempt}" if attempt else key)
  if split == "train":
    template, names = rng.choice(_TRAIN_ORDER), TRAIN_NAMES
  elif split == "test":
    template = rng.choices(_TRAIN_ORDER, weights=TEST_MIX)[0]
    names = TRAIN_NAMES
  else:
    template, names = rng.choice(_HELD_ORDER), TEST_NAMES
  return make_problem(template, rng, names, phrasing)


def _problems(split: str, seed: int, start: int, stop: int,
              phrasing: str = DEFAULT_PHRASING) -> list[dict]:
  """Problems start..stop-1 of a split's stream."""
  return [draw(split, seed, i, phrasing=phrasing) for i in range(start, stop)]


def held_out(problems: list[dict], exclude: list[dict], n: int, seed: int,
             split: str, phrasing: str = DEFAULT_PHRASING) -> list[dict]:
  """The first `n` problems of `split` whose question is not in `exclude`
  (drawing further indices of the same stream to replace dropped ones)."""
  seen = {p["question"] for p in exclude}
  kept = [p for p in problems if p["question"] not in seen]
  more = len(problems)
  while len(kept) < n:
    extra = _problems(split, seed, more, more + n - len(kept), phrasing)
    more += len(extra)
    kept += [p for p in extra if p["question"] not in seen]
  return kept[:n]


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
                 n_ood: int = 0, workers: int = 1,
                 phrasing: str = DEFAULT_PHRASING) -> dict:
  """Writes OUT/train.jsonl, OUT/test.jsonl (held out: no question of it
  occurs in train), OUT/ood.jsonl when n_ood > 0, and OUT/info.json;
  returns the info (sizes, seeds, template lists, duplicates dropped)."""
  out = Path(out_dir)
  test_seed = seed + 1 if test_seed is None else test_seed
  train = generate(n_train, seed, "train", workers, phrasing)
  drawn = generate(n_test, test_seed, "test", phrasing=phrasing)
  test = held_out(drawn, train, n_test, test_seed, "test", phrasing)
  write_jsonl(out / "train.jsonl", train)
  write_jsonl(out / "test.jsonl", test)
  if n_ood:
    write_jsonl(out / "ood.jsonl",
                generate(n_ood, test_seed, "ood", phrasing=phrasing))
  train_questions = {p["question"] for p in train}
  dropped = sum(p["question"] in train_questions for p in drawn)
  info = {"train": n_train, "test": n_test, "ood": n_ood, "seed": seed,
          "test_seed": test_seed, "phrasing": phrasing,
          "test_in_train_dropped": dropped,
          "train_templates": sorted(TRAIN_TEMPLATES),
          "test_mix": dict(zip(sorted(TRAIN_TEMPLATES), TEST_MIX)),
          "ood_templates": sorted(HELD_OUT_TEMPLATES)}
  (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
  return info
