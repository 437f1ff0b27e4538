"""Evaluation tasks: problems with their prompts, and how outputs are scored.

A task has `name`, `metric`, `chat` (whether prompts use the checkpoint's
chat template), `settings()` (recorded with the run),
`problems(render) -> list[Problem]` and `score(problems, outputs) -> list of
per-problem dicts` (each with "output", the text scored, and "correct").
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any, Callable, Sequence

Render = Callable[..., str]


@dataclasses.dataclass(frozen=True)
class Problem:
  """id: stable name ('gsm8k/12'); index: position in the dataset (seeds the
  row); prompt: the exact text fed to the model; reference: what scoring
  needs (target answer, tests)."""

  id: str
  index: int
  prompt: str
  reference: dict[str, Any]


def make_render(tokenizer, chat: bool) -> Render:
  """render(user, prefix='') -> prompt text. With chat, `user` becomes the
  user turn of the checkpoint's chat template and `prefix` starts the
  assistant turn; without, the two are simply joined."""

  def render(user: str, prefix: str = "") -> str:
    if not chat:
      return user + prefix
    turn = [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(turn, add_generation_prompt=True)
    return text + prefix

  return render


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
  """text up to the earliest stop sequence (all of it if none occurs)."""
  cut = len(text)
  for stop in stops:
    at = text.find(stop)
    if at != -1:
      cut = min(cut, at)
  return text[:cut]


def read_jsonl(path: str | Path, keys: Sequence[str], what: str) -> list[dict]:
  """Rows of a .jsonl (or .jsonl.gz) file, each an object with string
  values for `keys`; a clear error names the file and line otherwise."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{what} data file {path} not found")
  opener = gzip.open if path.suffix == ".gz" else open
  rows = []
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{lineno}: malformed {what} data, not "
                           f"valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
          raise ValueError(f"{path}:{lineno}: malformed {what} data, "
                           "expected a JSON object")
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
          raise ValueError(f"{path}:{lineno}: malformed {what} data, missing "
                           f"string field(s) {missing}")
        rows.append(row)
  except (UnicodeDecodeError, OSError, EOFError) as e:
    raise ValueError(f"{path}: malformed {what} data ({e})") from None
  if not rows:
    raise ValueError(f"{path}: malformed {what} data, no problems in it")
  return rows
