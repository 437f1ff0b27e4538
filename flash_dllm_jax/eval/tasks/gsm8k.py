"""GSM8K: the 1319 test problems, k-shot from the train split, lm-eval style.

Prompt (lm-eval's gsm8k task): k exemplars "Question: {q}\\nAnswer: {a}"
separated by blank lines, then "Question: {q}\\nAnswer:". Exemplars are drawn
with random.Random(1234) (lm-eval's few-shot seed), `sample(train, k)` for each
test problem in dataset order, so problem i always gets the same shots
whatever --limit or resume do. With chat the whole text is the user turn.
Outputs are cut at lm-eval's stop sequences. Answer: the number after
'####', else the last number; exact numeric match with the target.
"""

from __future__ import annotations

import decimal
import hashlib
import random
import re
from pathlib import Path
from typing import Sequence

from flash_dllm_jax.eval.tasks import (Problem, Render, cut_at_stops,
                                       read_jsonl)

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "data" / "gsm8k"
STOP_SEQUENCES = ("Question:", "</s>", "<|im_end|>")
FEWSHOT_SEED = 1234

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY = re.compile(_NUMBER)


def normalize_number(text: str) -> str:
  """'$1,080.00' -> '1080', '-3.50' -> '-3.5' (unparsable text is returned
  stripped of ',', '$' and a trailing '.')."""
  text = text.replace(",", "").replace("$", "").strip().rstrip(".")
  try:
    value = decimal.Decimal(text)
  except decimal.InvalidOperation:
    return text
  if not value.is_finite():
    return text
  value = value.normalize()
  return format(value, "f") if value != 0 else "0"


def extract_answer(text: str) -> str | None:
  """The normalized number after '####', else the last number, else None."""
  strict = _STRICT.search(text)
  if strict:
    return normalize_number(strict.group(1))
  numbers = _ANY.findall(text)
  return normalize_number(numbers[-1]) if numbers else None


def target_of(answer: str) -> str:
  """The reference answer: what follows '####' in a dataset answer."""
  return normalize_number(answer.split("####")[-1])


def is_correct(predicted: str | None, target: str) -> bool:
  return predicted is not None and predicted == target


def load_split(data_dir: str | Path, split: str) -> list[dict]:
  path = Path(data_dir) / f"{split}.jsonl"
  rows = read_jsonl(path, ("question", "answer"), f"GSM8K {split}")
  for lineno, row in enumerate(rows, 1):
    if "####" not in row["answer"]:
      raise ValueError(f"{path}: malformed GSM8K data, problem {lineno}'s "
                       "answer has no '#### <number>' line")
  return rows


def fewshot_text(question: str, shots: Sequence[dict]) -> str:
  parts = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
  return "\n\n".join(parts + [f"Question: {question}\nAnswer:"])


class GSM8K:
  """The task over `data_dir`/test.jsonl (and train.jsonl for shots)."""

  name = "gsm8k"
  metric = "accuracy"

  def __init__(self, data_dir: str | Path = DEFAULT_DATA, num_fewshot: int = 5,
               chat: bool = False):
    if not isinstance(num_fewshot, int) or num_fewshot < 0:
      raise ValueError(f"num_fewshot must be an int >= 0, got {num_fewshot!r}")
    self.data_dir = Path(data_dir)
    if not self.data_dir.is_dir():
      raise FileNotFoundError(f"GSM8K data directory {self.data_dir} not "
                              "found (it should hold test.jsonl, train.jsonl)")
    self.num_fewshot, self.chat = num_fewshot, chat
    self.test = load_split(self.data_dir, "test")
    self.train = load_split(self.data_dir, "train") if num_fewshot else []
    if num_fewshot > len(self.train):
      raise ValueError(f"num_fewshot {num_fewshot} exceeds the "
                       f"{len(self.train)} train problems")

  def settings(self) -> dict:
    digest = hashlib.sha256((self.data_dir / "test.jsonl").read_bytes())
    return {"chat": self.chat, "data": str(self.data_dir.absolute()),
            "test_sha256": digest.hexdigest(), "num_fewshot": self.num_fewshot,
            "fewshot_seed": FEWSHOT_SEED, "stop_sequences": STOP_SEQUENCES}

  def problems(self, render: Render) -> list[Problem]:
    rnd = random.Random(FEWSHOT_SEED)
    out = []
    for i, row in enumerate(self.test):
      shots = (rnd.sample(self.train, self.num_fewshot) if self.num_fewshot
               else [])
      out.append(Problem(f"gsm8k/{i}", i,
                         render(fewshot_text(row["question"], shots)),
                         {"target": target_of(row["answer"])}))
    return out

  def score(self, problems: Sequence[Problem],
            outputs: Sequence[str]) -> list[dict]:
    results = []
    for problem, text in zip(problems, outputs):
      cut = cut_at_stops(text, STOP_SEQUENCES)
      answer = extract_answer(cut)
      target = problem.reference["target"]
      results.append({"output": cut, "answer": answer, "target": target,
                      "correct": is_correct(answer, target)})
    return results
