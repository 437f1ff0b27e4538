"""The generate command's inputs and outputs: prompts from flags, files and
stdin; results as text, one JSON document or JSON lines."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from flash_dllm_jax import prompts as prompt_forms
from flash_dllm_jax.generate import answer_ids


def _decode(data: bytes, source: str) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"{source} line {line} is not valid UTF-8 ({e.reason} "
                     f"at byte {e.start}: {data[e.start:e.end + 8]!r})"
                     ) from None


def parse_prompt_text(text: str, source: str) -> list:
  """Prompts of a file or stdin: JSON lines (each {"prompt": str} or
  {"messages": [...]}) when the first non-blank line starts with '{', else
  one prompt per non-blank line."""
  lines = text.splitlines()
  numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
  if not numbered:
    raise ValueError(f"{source} has no prompts (it is empty)")
  if not numbered[0][1].lstrip().startswith("{"):
    return [line for _, line in numbered]
  out = []
  for n, line in numbered:
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{source} line {n}: not valid JSON ({e.msg})"
                       ) from None
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
      out.append(row["prompt"])
    elif isinstance(row, dict) and isinstance(row.get("messages"), list):
      out.append(prompt_forms.check_messages(row["messages"],
                                             f"{source} line {n}"))
    else:
      raise ValueError(f"{source} line {n}: expected an object with a "
                       "'prompt' string or a 'messages' list")
  return out


def read_prompts(flags: list[str] | None, prompt_file: Path | None,
                 stdin: TextIO | None = None) -> list:
  """--prompt values, then the --prompt-file's ('-': stdin); stdin itself
  when neither is given and it is not a terminal."""
  out = list(flags or [])
  for i, p in enumerate(out):
    prompt_forms.check_text(p, f"--prompt #{i + 1}")
  stdin = stdin or sys.stdin
  if prompt_file is not None:
    if str(prompt_file) == "-":
      out += parse_prompt_text(_decode(stdin.buffer.read(), "stdin"),
                               "stdin")
    elif not prompt_file.is_file():
      raise FileNotFoundError(f"prompt file {prompt_file} does not exist")
    else:
      out += parse_prompt_text(_decode(prompt_file.read_bytes(),
                                       str(prompt_file)), str(prompt_file))
  elif not out and stdin is not None and not stdin.isatty():
    out = parse_prompt_text(_decode(stdin.buffer.read(), "stdin"), "stdin")
  if not out:
    raise ValueError("no prompts: give --prompt, --prompt-file or lines on "
                     "stdin")
  return out


def _shown(prompt) -> str:
  """A prompt as the text output shows it: chats by their last message."""
  return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def records(prompts: list, out, config, seconds_B) -> list[dict[str, Any]]:
  """One JSON-ready dict per prompt: text, token ids (up to the stop token),
  steps, forwards, tokens/step (generated tokens with the stop token over
  steps) and seconds (the wall time of the decode call that made it,
  less the time that call spent compiling)."""
  rows = []
  for b, prompt in enumerate(prompts):
    ids = answer_ids(out.tokens_BxG[b], config)
    produced = min(len(ids) + 1, out.tokens_BxG.shape[1])
    steps = int(out.steps_B[b])
    rows.append({"prompt": prompt, "text": out.texts[b], "token_ids": ids,
                 "steps": steps, "forwards": int(out.forwards_B[b]),
                 "tokens_per_step": round(produced / max(steps, 1), 4),
                 "seconds": round(float(seconds_B[b]), 4)})
  return rows


def write(fmt: str, prompts: list, out, config, seconds_B, seconds: float,
          meta: dict[str, Any], stream: TextIO | None = None) -> None:
  stream = stream or sys.stdout
  rows = records(prompts, out, config, seconds_B)
  if fmt == "text":
    for prompt, row in zip(prompts, rows):
      stream.write(f">>> {_shown(prompt)}\n{row['text']}\n\n")
  elif fmt == "jsonl":
    for row in rows:
      stream.write(json.dumps(row, ensure_ascii=False) + "\n")
  else:
    doc = {**meta, "steps": int(out.steps), "seconds": round(seconds, 4),
           "results": rows}
    stream.write(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")


class Progress:
  """generate's progress hook: records each row's seconds (its decode
  call's wall time, less what the call spent compiling: `compiled`, a
  compilation.CompileLog) and, once there is more than one call, prints a
  progress line per call on stderr."""

  def __init__(self, n_rows: int, show: bool, compiled=None):
    self.seconds_B = np.zeros(n_rows)
    self._show, self._done, self._calls = show, 0, 0
    self._start = self._last = time.perf_counter()
    self._compiled = compiled
    self._spent = compiled.spent() if compiled is not None else 0.0

  def __call__(self, rows, total: int) -> None:
    now = time.perf_counter()
    spent = self._compiled.spent() if self._compiled is not None else 0.0
    self.seconds_B[rows] = max(now - self._last - (spent - self._spent), 0.0)
    self._last, self._done, self._calls = now, self._done + len(rows), \
        self._calls + 1
    self._spent = spent
    if self._show and (self._calls > 1 or self._done < total):
      print(f"[{self._done}/{total} prompts, {now - self._start:.1f} s]",
            file=sys.stderr, flush=True)
