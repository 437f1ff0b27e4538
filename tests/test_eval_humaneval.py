"""HumanEval: the sandboxed executor on the dataset's canonical solutions
and on broken, hanging and memory-hungry completions; prompts and stop
cutting; scripts/eval_humaneval.py end to end on the tiny checkpoint."""

import json
import secrets

import pytest

from tests import eval_case
from tests.sandbox_case import MODES, running
from tests.paths import TINY_CHECKPOINT
from flash_dllm_jax.eval import executor, sandbox
from flash_dllm_jax.eval.tasks import make_render
from flash_dllm_jax.eval.tasks.humaneval import HumanEval, program
from flash_dllm_jax.tokenizer import Tokenizer

# The end-to-end runs take bubblewrap where it works (CI installs it).
SANDBOX = "bwrap" if sandbox.bwrap_problem() is None else "rlimit"
LIMITS = executor.Limits(sandbox=SANDBOX)


@pytest.fixture(scope="module")
def task():
  return HumanEval(limits=LIMITS)


def test_every_canonical_solution_passes(task):
  """All 164, four subprocesses at a time."""
  assert len(task.rows) == 164
  checks = [program(r["prompt"], r["canonical_solution"], r["test"],
                    r["entry_point"]) for r in task.rows]
  results = executor.run_checks(checks, executor.Limits(timeout_s=20,
                                                        sandbox=SANDBOX),
                                workers=4)
  failed = [(r["task_id"], x.status, x.detail)
            for r, x in zip(task.rows, results) if not x.passed]
  assert not failed


@pytest.mark.parametrize("mode", MODES)
def test_bad_completions_fail_cleanly_within_the_timeout(task, mode):
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
      "sys_exit": ("failed", "SystemExit", "    raise SystemExit(0)\n"),
      "not_data": ("failed", "cannot cross", "    return object()\n"),
      "kill_parent": ("failed", "NoneType",
                      "    import os\n    os.kill(os.getppid(), 9)\n"),
  }
  limits = executor.Limits(timeout_s=3, memory_mb=256, sandbox=mode)
  checks = [program(row["prompt"], c, row["test"], row["entry_point"])
            for *_, c in completions.values()]
  # A program that forks a child and hangs: the whole group must die.
  marker = "fdj-test-" + secrets.token_hex(8)
  checks.append(executor.Check(
      f"import posix, sys\nif not posix.fork():\n    posix.execv("
      f"sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)',"
      f" '{marker}'])\nimport time\ntime.sleep(600)\n", row["test"],
      row["entry_point"]))
  results = executor.run_checks(checks, limits, workers=len(checks))
  for (name, (status, detail, _)), result in zip(completions.items(), results):
    assert (result.status, name) == (status, name), result
    assert detail in result.detail, (name, result)
    assert result.seconds < limits.timeout_s + 5
  assert results[-1].status == "timeout"
  assert not running(marker)


def test_limits_are_checked():
  with pytest.raises(ValueError, match="timeout must be > 0"):
    executor.Limits(timeout_s=0)
  with pytest.raises(ValueError, match="timeout must be > 0"):
    executor.Limits(timeout_s=float("inf"))
  with pytest.raises(ValueError, match="memory limit"):
    executor.Limits(memory_mb=8)
  with pytest.raises(ValueError, match="process limit"):
    executor.Limits(processes=0)
  with pytest.raises(ValueError, match="sandbox must be one of"):
    executor.Limits(sandbox="auto")
  with pytest.raises(ValueError, match="entry point must be an identifier"):
    executor.Check("", "", "f()")


def test_completions_are_cut_at_stop_sequences(task):
  problems = task.problems(lambda u, p="": u + p)[:1]
  body = "    return True\n"
  out = task.score(problems, [body + "\ndef helper():\n    pass\n"])[0]
  assert out["output"] == body and out["result"] == "failed"
  for tail in ["\nprint(1)", "\nif x:", "\n# note", "\nclass A:"]:
    assert task.score(problems, [body + tail])[0]["output"] == body
  chat = HumanEval(limits=LIMITS, chat=True)
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
  run = eval_case.run_script("humaneval", tmp_path / "out", "--timeout", "5",
                             "--sandbox", SANDBOX)
  assert "| humaneval | tiny | llada | 3 | 0.0% |" in run.result.stdout
  ids = sorted(r["id"] for r in run.records)
  assert ids == [f"HumanEval/{i}" for i in range(3)]
  for r in run.records:  # gibberish completions fail, but cleanly
    assert r["passed"] is False and r["result"] in ("failed", "timeout")
  assert run.summary["metric"] == "pass@1" and run.summary["score"] == 0.0
  assert run.settings["timeout_s"] == 5.0
  assert run.settings["memory_mb"] == 1024
  assert run.settings["sandbox"] == SANDBOX


def test_without_bwrap_humaneval_refuses_and_rlimit_warns_once(
    monkeypatch, tmp_path, capsys):
  monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
  sandbox.bwrap_problem.cache_clear()
  sandbox._warn_rlimit.cache_clear()
  try:
    assert sandbox.bwrap_problem().startswith("bwrap is not installed")
    with pytest.raises(ValueError, match=r"only in the bubblewrap sandbox, "
                       r"but bwrap is not installed \(Debian package "
                       r"bubblewrap\)") as e:
      HumanEval()
    assert "\n" not in str(e.value) and "--sandbox rlimit" in str(e.value)
    with pytest.raises(ValueError, match="Debian package bubblewrap"):
      executor.run_check(program("", "def f():\n    return 1\n",
                                 "def check(c):\n    pass\n", "f"))
    capsys.readouterr()
    limits = executor.Limits(sandbox="rlimit")
    task = HumanEval(limits=limits)
    assert task.settings()["sandbox"] == "rlimit"
    row = task.rows[0]
    check = program(row["prompt"], row["canonical_solution"], row["test"],
                    row["entry_point"])
    assert all(r.passed for r in executor.run_checks([check] * 2, limits))
    assert capsys.readouterr().err == sandbox.RLIMIT_WARNING + "\n"
  finally:
    sandbox.bwrap_problem.cache_clear()
    sandbox._warn_rlimit.cache_clear()
