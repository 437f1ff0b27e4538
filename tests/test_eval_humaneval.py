"""HumanEval: the sandboxed executor on the dataset's canonical solutions
and on broken, hanging and memory-hungry completions; prompts and stop
cutting; scripts/eval_humaneval.py end to end on the tiny checkpoint."""

import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

import pytest

from tests import eval_case
from tests.paths import TINY_CHECKPOINT
from flash_dllm_jax.eval import executor, sandbox
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
  except (FileNotFoundError, ProcessLookupError):
    return None


def _running(marker: str, wait_s: float = 5.0) -> list[int]:
  """Live (not zombie) processes whose command line holds marker, after
  waiting up to wait_s for them to go."""
  deadline = time.time() + wait_s
  while True:
    pids = []
    for d in Path("/proc").iterdir():
      try:
        if (d.name.isdigit() and marker.encode() in (d / "cmdline").read_bytes()
            and _state(int(d.name)) not in (None, "Z")):
          pids.append(int(d.name))
      except OSError:
        pass
    if not pids or time.time() > deadline:
      return pids
    time.sleep(0.1)


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
  marker = "fdj-test-" + secrets.token_hex(8)
  sources.append(f"import posix, sys\nif not posix.fork():\n"
                 f"    posix.execv(sys.executable, [sys.executable, '-c', "
                 f"'import time; time.sleep(600)', '{marker}'])\n"
                 "import time\ntime.sleep(600)\n")
  t0 = time.perf_counter()
  results = executor.run_programs(sources, limits, workers=len(sources))
  assert time.perf_counter() - t0 < limits.timeout_s + 10
  for (name, (status, detail, _)), result in zip(completions.items(), results):
    assert (result.status, name) == (status, name), result
    assert detail in result.detail, (name, result)
    assert result.seconds < limits.timeout_s + 5
  assert results[-1].status == "timeout"
  assert not _running(marker)


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
    executor.Limits(sandbox="docker")


# The sandboxes that can run here; what each guarantees is in the README.
MODES = [pytest.param("bwrap", marks=pytest.mark.skipif(
    sandbox.bwrap_problem() is not None,
    reason=str(sandbox.bwrap_problem()))), "rlimit"]
# Without bwrap a run's processes are bounded and all found again only
# through its own cgroup (or RLIMIT_NPROC, which does not bind root).
CONTAINED = sandbox.pids_cgroup_root() is not None


def _contained(mode, what):
  if mode == "rlimit" and not CONTAINED:
    pytest.skip(f"without bwrap or a pids cgroup, {what} is not contained")


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_is_bounded_and_leaves_nothing(mode):
  if os.geteuid() == 0:
    _contained(mode, "a fork bomb run by root")
  marker = "fdj-test-" + secrets.token_hex(8)
  bomb = ("import posix, sys\nn = 0\nwhile True:\n    try:\n"
          "        posix.fork()\n        n += 1\n    except OSError:\n"
          "        pass\n")
  source = (f"import sys, posix\nposix.execv(sys.executable, [sys.executable, "
            f"'-c', {bomb!r}, '{marker}'])\n")
  limits = executor.Limits(timeout_s=2, processes=8, sandbox=mode)
  t0 = time.perf_counter()
  result = executor.run_program(source, limits)
  assert result.status == "timeout" and not result.passed, result
  assert time.perf_counter() - t0 < 10
  assert not _running(marker)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("then", ["hang", "exit"])
def test_a_setsid_escape_dies_with_the_run(mode, then):
  _contained(mode, "a process in a new session")
  marker = "fdj-test-" + secrets.token_hex(8)
  source = ("import os, sys\nos.posix_spawn(sys.executable, [sys.executable, "
            f"'-c', 'import time; time.sleep(600)', '{marker}'], {{}}, "
            "setsid=True)\nprint('spawned', flush=True)\n"
            + ("import time\ntime.sleep(600)\n" if then == "hang" else ""))
  result = executor.run_program(source, executor.Limits(timeout_s=2,
                                                        sandbox=mode))
  assert "spawned" in result.output
  assert result.status == ("timeout" if then == "hang" else "passed"), result
  assert not _running(marker)


@pytest.mark.skipif(sandbox.bwrap_problem() is not None,
                    reason=str(sandbox.bwrap_problem()))
def test_bwrap_confines_writes_to_the_temporary_directory(tmp_path):
  outside = [ROOT / f"escape-{secrets.token_hex(4)}.txt",
             tmp_path / "escape.txt", Path.home() / "escape.txt"]
  for path in outside:
    source = (f"open({str(path)!r}, 'w').write('x')\n"
              "open('inside.txt', 'w').write('fine')\n")
    result = executor.run_program(source, executor.Limits(sandbox="bwrap"))
    assert not path.exists()
    if not path.is_relative_to("/tmp"):  # there: the private /tmp's copy
      assert result.status == "failed" and "Error" in result.detail, result
  # The interpreter's own folders are read-only, under /tmp too.
  venv = Path(sys.prefix) / f"escape-{secrets.token_hex(4)}.txt"
  result = executor.run_program(f"open({str(venv)!r}, 'w').write('x')\n",
                                executor.Limits(sandbox="bwrap"))
  assert result.status == "failed" and not venv.exists(), result
  # Its own directory, and a private /tmp that the host never sees.
  name = f"fdj-private-{secrets.token_hex(4)}"
  inside = executor.run_program("open('inside.txt', 'w').write('fine')\n"
                                f"open('/tmp/{name}', 'w').write('x')\n",
                                executor.Limits(sandbox="bwrap"))
  assert not (Path("/tmp") / name).exists()
  assert inside.passed, inside


def test_bwrap_keeps_an_interpreter_installed_under_tmp(monkeypatch):
  """A virtual environment under /tmp (say, of a clone there) would vanish
  behind the private /tmp: it is bound back, read-only, once (its bin/ is
  inside it); an interpreter elsewhere adds no binding."""
  for name in ("base_prefix", "base_exec_prefix"):
    monkeypatch.setattr(sandbox.sys, name, "/usr")
  monkeypatch.setattr(sandbox.sys, "prefix", "/tmp/clone/.venv")
  monkeypatch.setattr(sandbox.sys, "exec_prefix", "/tmp/clone/.venv")
  monkeypatch.setattr(sandbox.sys, "executable", "/tmp/clone/.venv/bin/py")
  args = sandbox.bwrap_args(Path("/tmp/work"))
  i = args.index("--tmpfs")
  assert args[i:i + 5] == ["--tmpfs", "/tmp", "--ro-bind", "/tmp/clone/.venv",
                           "/tmp/clone/.venv"]
  assert args.count("--ro-bind") == 2 and args.count("--bind") == 1
  for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix"):
    monkeypatch.setattr(sandbox.sys, name, "/usr")
  monkeypatch.setattr(sandbox.sys, "executable", "/usr/bin/python3")
  assert sandbox.bwrap_args(Path("/tmp/work")).count("--ro-bind") == 1


@pytest.mark.skipif(sandbox.bwrap_problem() is not None,
                    reason=str(sandbox.bwrap_problem()))
def test_bwrap_has_no_network():
  """A server on the host's 127.0.0.1 gets no connection from the program;
  the same program reaches it under the rlimit sandbox (which has network:
  the check is real)."""
  with socket.create_server(("127.0.0.1", 0)) as server:
    server.settimeout(0.5)
    port = server.getsockname()[1]
    source = ("import socket\n"
              f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
    result = executor.run_program(source, executor.Limits(sandbox="bwrap"))
    assert result.status == "failed" and "Error" in result.detail, result
    with pytest.raises(TimeoutError):
      server.accept()
    plain = executor.run_program(source, executor.Limits(sandbox="rlimit"))
    assert plain.passed, plain
    server.accept()[0].close()


def test_auto_uses_bwrap_where_it_works():
  want = "bwrap" if sandbox.bwrap_problem() is None else "rlimit"
  assert sandbox.sandbox_mode("auto") == want
  assert sandbox.sandbox_mode("rlimit") == "rlimit"
  assert HumanEval().settings()["sandbox"] == want


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
  run = eval_case.run_script("humaneval", tmp_path / "out", "--timeout", "5")
  assert "| humaneval | tiny | llada | 3 | 0.0% |" in run.result.stdout
  ids = sorted(r["id"] for r in run.records)
  assert ids == [f"HumanEval/{i}" for i in range(3)]
  for r in run.records:  # gibberish completions fail, but cleanly
    assert r["passed"] is False and r["result"] in ("failed", "timeout")
  assert run.summary["metric"] == "pass@1" and run.summary["score"] == 0.0
  assert run.settings["timeout_s"] == 5.0
  assert run.settings["memory_mb"] == 1024


def test_without_bwrap_auto_falls_back_and_says_so(monkeypatch, tmp_path,
                                                   capsys):
  monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
  sandbox.bwrap_problem.cache_clear()
  try:
    assert sandbox.bwrap_problem().startswith("bwrap is not installed")
    assert sandbox.sandbox_mode("auto") == "rlimit"
    assert "warning: test programs run in the rlimit sandbox" in (
        capsys.readouterr().err)
    with pytest.raises(ValueError, match="'bwrap' was asked for, but bwrap "
                       "is not installed"):
      sandbox.sandbox_mode("bwrap")
    result = executor.run_program("print('ran')\n", executor.Limits())
    assert result.passed and result.output == "ran\n"
  finally:
    sandbox.bwrap_problem.cache_clear()
