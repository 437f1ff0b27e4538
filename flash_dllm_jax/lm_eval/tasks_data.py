"""Datasets of the shipped lm-eval tasks, read from the project's local copies.

lm-eval calls these (`custom_dataset:` in the task yaml) with the task's
metadata and dataset_kwargs as keywords; `data_dir` (e.g. through lm-eval's
`--metadata '{"data_dir": "..."}'`) replaces the default directory, and
every other keyword (lm-eval also passes the model_args) is ignored.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from flash_dllm_jax.eval.tasks import read_jsonl

DATA = Path(__file__).resolve().parents[2] / "data"


def _splits(data_dir, default: str, files: dict[str, str],
            what: str) -> datasets.DatasetDict:
  root = Path(data_dir) if data_dir else DATA / default
  if not root.is_dir():
    raise FileNotFoundError(f"{what} data directory {root} not found (pass "
                            "--metadata '{\"data_dir\": \"DIR\"}')")
  out = {}
  for split, name in files.items():
    rows = read_jsonl(root / name, ("question", "answer"), f"{what} {split}")
    out[split] = datasets.Dataset.from_list(
        [{"question": r["question"], "answer": r["answer"]} for r in rows])
  return datasets.DatasetDict(out)


def gsm8k(data_dir: str | None = None, **_) -> datasets.DatasetDict:
  """GSM8K's train (few-shot pool) and test splits from data/gsm8k."""
  return _splits(data_dir, "gsm8k", {"train": "train.jsonl",
                                     "test": "test.jsonl"}, "GSM8K")


def synthetic_gsm(data_dir: str | None = None, **_) -> datasets.DatasetDict:
  """The shipped model's 1000 held-out problems (data/synthetic_gsm)."""
  return _splits(data_dir, "synthetic_gsm", {"test": "test.jsonl"},
                 "synthetic GSM")


def synthetic_gsm_ood(data_dir: str | None = None,
                      **_) -> datasets.DatasetDict:
  """The 500 problems of templates training never used."""
  return _splits(data_dir, "synthetic_gsm", {"test": "ood.jsonl"},
                 "synthetic GSM (ood)")
