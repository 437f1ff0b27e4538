"""HumanEval: the sandboxed executor on the dataset's canonical solutions
and on broken, hanging and memory-hungry completions; prompts and stop
cutting; scripts/eval_humaneval.py end to end on the tiny checkpoint."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import TINY_CHECKPOINT
from flash_dllm_jax.eval import executor
from flash_dllm_jax.eval.tasks import make_render
from flash_dllm_jax.eval.tasks.humaneval import HumanEval, program
from flash_dllm_jax.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def task():
  return HumanEval()


def test_every_canonical_solution_passes(task):
  """All 164, four subprocesses at a time."""
  assert len(task.rows) == 164
  sources = [program(r["prompt"], r["canonical_solution"], r["test"],
                     r["entry_point"]) for r in task.rows]
  t0 = time.perf_counter()
  results = executor.run_programs(sources, executor.Limits(timeout_s=20),
                                  workers=4)
  failed = [(r["task_id"], x.status, x.detail)
            for r, x in zip(task.rows, results) if not x.passed]
  assert not failed
  assert time.perf_counter() - t0 < 60


def _state(pid: int) -> str | None:
  try:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
      if line.startswith("State:"):
        return line.split()[1]
  except FileNotFoundError:
    return None


def test_bad_completions_fail_cleanly_within_the_timeout(task):
  row = task.rows[0]  # has_close_elements
  body = "    return False\n"  # wrong on half the asserts
  completions = {
      "wrong": ("failed", "AssertionError", body),
      "syntax": ("failed", "SyntaxError", "    return (\n"),
      "raises": ("failed", "ZeroDivisionError", "    return 1 / 0\n"),
      "spin": ("timeout", "", "    while True:\n        pass\n"),
      "sleep": ("timeout", "", "    import time\n    time.sleep(600)\n"),
      "hog_mem": ("failed", "MemoryError",
                  "    x = bytearray(4 * 2**30)\n    return True\n"),
      "grow_mem": ("failed", "MemoryError", "    l = []\n    while True:\n"
                   "        l.append(' ' * 2**20)\n"),
      "exit0": ("failed", "before the tests finished",
                "    import os\n    os._exit(0)\n"),
      "kill_parent": ("failed", "NoneType",
                      "    import os\n    os.kill(os.getppid(), 9)\n"),
  }
  limits = executor.Limits(timeout_s=3, memory_mb=256)
  sources = [program(row["prompt"], c, row["test"], row["entry_point"])
             for *_, c in completions.values()]
  # A program that forks a child and hangs: the whole group must die.
  sources.append("import posix, time\npid = posix.fork()\n"
                 "if pid:\n    print('child', pid, flush=True)\n"
                 "time.sleep(600)\n")
  t0 = time.perf_counter()
  results = executor.run_programs(sources, limits, workers=len(sources))
  assert time.perf_counter() - t0 < limits.timeout_s + 10
  for (name, (status, detail, _)), result in zip(completions.items(), results):
    assert (result.status, name) == (status, name), result
    assert detail in result.detail, (name, result)
    assert result.seconds < limits.timeout_s + 5
  fork = results[-1]
  assert fork.status == "timeout"
  child = int(fork.output.split("child ")[1].split()[0])
  deadline = time.time() + 5
  while _state(child) not in (None, "Z") and time.time() < deadline:
    time.sleep(0.1)
  assert _state(child) in (None, "Z")  # gone (or a zombie awaiting init)


def test_limits_are_checked():
  with pytest.raises(ValueError, match="timeout must be > 0"):
    executor.Limits(timeout_s=0)
  with pytest.raises(ValueError, match="memory limit"):
    executor.Limits(memory_mb=8)


def test_completions_are_cut_at_stop_sequences(task):
  problems = task.problems(lambda u, p="": u + p)[:1]
  body = "    return True\n"
  out = task.score(problems, [body + "\ndef helper():\n    pass\n"])[0]
  assert out["output"] == body and out["result"] == "failed"
  for tail in ["\nprint(1)", "\nif x:", "\n# note", "\nclass A:"]:
    assert task.score(problems, [body + tail])[0]["output"] == body
  chat = HumanEval(chat=True)
  tok = Tokenizer.from_dir(TINY_CHECKPOINT)
  problem = chat.problems(make_render(tok, True))[0]
  code = chat.rows[0]["prompt"]
  assert problem.prompt.endswith(
      "Here is the completed function:\n```python\n" + code + "\n")
  assert "Write a solution to the following problem" in problem.prompt
  assert chat.score([problem], [body + "```\nExplanation"])[0]["output"] == body


def test_bad_data_is_reported(tmp_path):
  with pytest.raises(FileNotFoundError, match="HumanEval data file"):
    HumanEval(tmp_path / "missing.jsonl")
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: .*'entry_point'"):
    HumanEval(bad)
  gz = tmp_path / "bad.jsonl.gz"
  gz.write_bytes(b"not gzip")
  with pytest.raises(ValueError, match="malformed HumanEval data"):
    HumanEval(gz)


def test_script_end_to_end(tmp_path):
  out = tmp_path / "out"
  cmd = [sys.executable, str(ROOT / "scripts" / "eval_humaneval.py"),
         "--limit", "3", "--batch-size", "2", "--gen-length", "16",
         "--steps", "8", "--block-length", "8", "--timeout", "5",
         "--out-dir", str(out), "--run-name", "tiny", "--no-progress",
         "--checkpoint", str(TINY_CHECKPOINT)]
  result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "| humaneval | tiny | llada | 3 | 0.0% |" in result.stdout
  records = [json.loads(l) for l in (out / "tiny/records.jsonl").open()]
  ids = sorted(r["id"] for r in records)
  assert ids == [f"HumanEval/{i}" for i in range(3)]
  for r in records:  # gibberish completions fail, but cleanly
    assert r["passed"] is False and r["result"] in ("failed", "timeout")
    assert r["tokens"] >= 1 and r["forwards"] >= 1 and r["wall_s"] > 0
  summary = json.loads((out / "tiny/summary.json").read_text())
  assert summary["metric"] == "pass@1" and summary["score"] == 0.0
  settings = json.loads((out / "tiny/run.json").read_text())
  assert settings["timeout_s"] == 5.0 and settings["memory_mb"] == 1024
  assert (out / "accuracy_vs_throughput.png").read_bytes()[:4] == b"\x89PNG"
