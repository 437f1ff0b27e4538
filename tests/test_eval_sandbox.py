"""The sandbox that runs generated code: each attack below fails. The bwrap
tests need bubblewrap (tests/sandbox_case.py); the rlimit sandbox is tested for what it protects (limits,
leftover processes, the verdict), and shown to let through what it says it
does not (so the bwrap checks are real)."""

import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flash_dllm_jax.eval import checker, executor, sandbox
from tests.paths import ROOT
from tests.sandbox_case import CONTAINED, MODES, NEEDS_BWRAP, running

PASSES = "def check(candidate):\n    assert candidate() == 1\n"
FAILS = "def check(candidate):\n    candidate()\n    assert False\n"


def run(code: str, mode: str, test: str = PASSES, inside: bool = False,
        **limits) -> executor.ExecResult:
  """`code` at the top of the program, or (inside) in the function that
  the tests call; the function returns 1."""
  body = textwrap.indent(code, "    ") if inside else "    pass\n"
  source = ("" if inside else code) + f"\ndef f():\n{body}\n    return 1\n"
  return executor.run_check(executor.Check(source, test, "f"),
                            executor.Limits(sandbox=mode, **limits))


FORGE = '["passed", ""]'
ATTACKS = {  # each tries to make `assert False` pass
    "token": "import os\nfor name in ('finished', 'verdict', 'passed'):\n"
             "    open(name, 'w').write(open('/proc/self/cmdline').read())\n"
             "print(open('/proc/self/environ').read(), 'passed', flush=True)\n"
             "os._exit(0)\n",
    "builtins": "import builtins\n"
                "builtins.AssertionError = type('X', (Exception,), {})\n",
    "fds": "import os\nfor fd in range(1024):\n    try:\n"
           f"        os.write(fd, b'{FORGE}')\n    except OSError:\n"
           "        pass\nos._exit(0)\n",
    "frames": "import os, sys\nframe, seen = sys._getframe(), set()\n"
              "while frame:\n    seen |= {v for v in frame.f_locals.values()"
              " if type(v) is int}\n    frame = frame.f_back\nfor fd in seen:\n"
              f"    try:\n        os.write(fd, b'{FORGE}')\n"
              "    except OSError:\n        pass\n",
    # Under rlimit only the checker's: the host's processes are not fair game.
    "proc": "import os\nfor pid in {pids}:\n    try:\n"
            "        fds = os.listdir(f'/proc/{pid}/fd')\n    except OSError:\n"
            "        continue\n    for fd in fds:\n        try:\n"
            f"            open(f'/proc/{{pid}}/fd/{{fd}}', 'w').write('{FORGE}')"
            "\n        except OSError:\n            pass\nos._exit(0)\n",
    "kill_checker": "import os, posix\nposix.kill(os.getppid(), 9)\n",
    "exit0": "import sys\nsys.exit(0)\n",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inside", [False, True], ids=["top", "called"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_failing_test_cannot_be_made_to_pass(mode, inside, attack):
  pids = "os.listdir('/proc')" if mode == "bwrap" else "[os.getppid()]"
  code = ATTACKS[attack].replace("{pids}", pids)
  result = run(code, mode, FAILS, inside=inside, timeout_s=5)
  assert result.status in ("failed", "killed"), result


@pytest.mark.parametrize("mode", MODES)
def test_only_plain_data_crosses_to_the_tests(mode):
  """An object equal to everything stays in the candidate process."""
  code = "class Yes:\n    __eq__ = lambda self, other: True\nreturn Yes()\n"
  test = "def check(candidate):\n    assert candidate() == 2\n"
  result = run(code, mode, test, inside=True)
  assert result.status == "failed" and "cannot cross" in result.detail
  right = run("return {'a': (1, 2.5), 'b': [None, b'x', {3}]}\n", mode,
              "def check(c):\n    assert c() == {'a': (1, 2.5), "
              "'b': [None, b'x', {3}]}\n", inside=True)
  assert right.passed, right


def test_the_codec_round_trips_plain_data_and_refuses_the_rest():
  value = [1, -2.5, float("inf"), "s\udc80", True, None, (1, (2,)), {1, 2},
           frozenset({3}), {"k": [1], (1, 2): {}}, b"\x00\xff", 10**40]
  through = lambda v: checker.decode(json.loads(json.dumps(checker.encode(v))))
  assert through(value) == value
  assert type(through((1,))) is tuple and type(through({1})) is set
  for bad in (["tuple", 3], ["object", []], {"a": 1}, ["list", [1], 2]):
    with pytest.raises(ValueError, match="not plain data"):
      checker.decode(bad)
  with pytest.raises(TypeError, match="function cannot cross"):
    checker.encode(lambda: 1)


@NEEDS_BWRAP
def test_bwrap_hides_the_host_files(tmp_path):
  """Nothing of the project tree, the home or /tmp, nor /etc's secrets: a
  program under rlimit reads the same planted files (the check is real)."""
  secret = secrets.token_hex(8)
  planted = [ROOT / f"fdj-secret-{secret}", Path.home() / f".fdj-{secret}",
             tmp_path / "secret"]
  host = [ROOT / "pyproject.toml", ROOT / "README.md", Path("/etc/shadow"),
          Path("/etc/passwd"), Path.home() / ".bashrc", Path("/root/.bashrc"),
          Path.home() / ".gitconfig", Path("/root/.gitconfig")]
  paths = planted + [p for p in host if p.exists()]
  code = (f"for p in {[str(p) for p in paths]!r}:\n    try:\n"
          "        print('READ', open(p).read(64))\n"
          "    except OSError:\n        print('DENIED')\n")
  try:
    for p in planted:
      p.write_text(secret)
    hidden = run(code, "bwrap")
    plain = run(code, "rlimit")
  finally:
    for p in planted:
      p.unlink()
  assert hidden.passed and "READ" not in hidden.output, hidden
  assert secret not in hidden.output + hidden.detail
  assert hidden.output.count("DENIED") == len(paths)
  assert plain.output.count(secret) == len(planted), plain


@NEEDS_BWRAP
def test_bwrap_runs_as_nobody_with_a_read_only_view(tmp_path):
  code = ("import os\nprint('ids', os.getuid(), os.getgid())\n"
          "print('root', sorted(os.listdir('/')))\n"
          "print('etc', sorted(os.listdir('/etc')))\n")
  result = run(code, "bwrap")
  assert result.passed, result
  assert "ids 65534 65534" in result.output
  etc = {Path(p).name for p in sandbox.SYSTEM if p.startswith("/etc/")
         and os.path.lexists(p)}
  assert f"etc {sorted(etc)}" in result.output
  outside = [ROOT / f"escape-{secrets.token_hex(4)}.txt",
             tmp_path / "escape.txt", Path.home() / "escape.txt",
             Path(sys.prefix) / "escape.txt", Path(sys.base_prefix) / "x.txt",
             Path("/escape.txt"), Path("/etc/escape.txt"),
             Path("/tmp") / f"fdj-private-{secrets.token_hex(4)}"]
  for path in outside:
    wrote = run(f"open({str(path)!r}, 'w').write('x')\n", "bwrap")
    assert wrote.status == "failed" and "Error" in wrote.detail, wrote
    assert not path.exists()
  inside = run("open('inside.txt', 'w').write('fine')\n"
               "assert open('inside.txt').read() == 'fine'\n", "bwrap")
  assert inside.passed, inside


def test_bwrap_binds_only_the_interpreters_folders(monkeypatch):
  """A virtual environment inside a project under /tmp (a CI clone) is
  bound alone, read-only; an interpreter in /usr adds no binding."""
  for name in ("base_prefix", "base_exec_prefix"):
    monkeypatch.setattr(sandbox.sys, name, "/usr")
  for name in ("prefix", "exec_prefix"):
    monkeypatch.setattr(sandbox.sys, name, "/tmp/clone/.venv")
  monkeypatch.setattr(sandbox.sys, "executable", "/tmp/clone/.venv/bin/py")
  monkeypatch.setattr(sandbox.site, "getsitepackages", lambda: [
      "/tmp/clone/.venv/lib/python3.11/site-packages"])
  monkeypatch.setattr(sandbox.Path, "is_dir", lambda self: True)
  args = sandbox.bwrap_args(Path("/tmp/work"))
  binds = [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]
  system = [p for p in sandbox.SYSTEM
            if os.path.exists(p) and not os.path.islink(p)]
  assert sorted(binds) == sorted(system + ["/tmp/clone/.venv"])
  assert args.count("--bind") == 1 and args[args.index("--bind") + 1:][:2] == [
      "/tmp/work", "/tmp/work"]
  assert ["--uid", "65534", "--gid", "65534"] == args[3:7]
  assert "--unshare-user" in args and args[-3:] == ["--remount-ro", "/", "--"]
  for name in ("prefix", "exec_prefix"):
    monkeypatch.setattr(sandbox.sys, name, "/usr")
  monkeypatch.setattr(sandbox.sys, "executable", "/usr/bin/python3")
  monkeypatch.setattr(sandbox.site, "getsitepackages",
                      lambda: ["/usr/lib/python3/dist-packages"])
  assert sandbox.interpreter_folders() == []


@NEEDS_BWRAP
def test_bwrap_has_no_network():
  """A server on the host's 127.0.0.1 gets no connection from the program;
  the same program reaches it under rlimit."""
  with socket.create_server(("127.0.0.1", 0)) as server:
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = ("import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
    result = run(code, "bwrap")
    assert result.status == "failed" and "Error" in result.detail, result
    with pytest.raises(TimeoutError):
      server.accept()
    plain = run(code, "rlimit")
    assert plain.passed, plain
    server.accept()[0].close()


@NEEDS_BWRAP
def test_bwrap_cannot_signal_host_processes():
  """posix.kill (which the guard does not cover) of a host process; under
  rlimit the same call kills it."""
  code = "import posix\nposix.kill({pid}, 9)\n"
  host = subprocess.Popen(["sleep", "600"])
  try:
    result = run(code.format(pid=host.pid), "bwrap")
    assert result.status == "failed", result
    assert host.poll() is None
    plain = run(code.format(pid=host.pid), "rlimit")
    assert plain.passed and host.wait(timeout=10) == -9, plain
  finally:
    host.kill()
    host.wait()


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_is_bounded_and_leaves_nothing(mode):
  bounded = CONTAINED or os.geteuid() != 0  # RLIMIT_NPROC binds non-root
  if mode == "rlimit" and not bounded:
    pytest.skip("without bwrap or a pids cgroup, root's processes are "
                "neither bounded nor found again")
  marker = "fdj-test-" + secrets.token_hex(8)
  count = ("import posix, sys, time\nn = 0\nfor _ in range(100):\n"
           "    try:\n        pid = posix.fork()\n    except OSError:\n"
           "        break\n    if not pid:\n        posix.execv(sys.executable,"
           f" [sys.executable, '-c', 'import time; time.sleep(600)', "
           f"'{marker}'])\n    n += 1\nprint('forked', n, flush=True)\n")
  if bounded:  # the program's own process and at most 7 more
    counted = run(count, mode, processes=8)
    assert counted.passed and "forked" in counted.output, counted
    assert int(counted.output.split("forked")[1].split()[0]) <= 7
    assert not running(marker)
  bomb = ("import posix, sys\nn = 0\nwhile True:\n    try:\n"
          "        posix.fork()\n        n += 1\n    except OSError:\n"
          "        pass\n")
  code = (f"import sys, posix\nposix.execv(sys.executable, [sys.executable, "
          f"'-c', {bomb!r}, '{marker}'])\n")
  result = run(code, mode, timeout_s=2, processes=8)
  assert result.status == "timeout", result
  assert not running(marker)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("then", ["hang", "exit"])
def test_a_setsid_escape_dies_with_the_run(mode, then):
  if mode == "rlimit" and not CONTAINED:
    pytest.skip("without bwrap or a pids cgroup, a process in a new session "
                "is not found again")
  marker = "fdj-test-" + secrets.token_hex(8)
  code = ("import os, sys\nos.posix_spawn(sys.executable, [sys.executable, "
          f"'-c', 'import time; time.sleep(600)', '{marker}'], {{}}, "
          "setsid=True)\nprint('spawned', flush=True)\n"
          + ("import time\ntime.sleep(600)\n" if then == "hang" else ""))
  result = run(code, mode, timeout_s=2)
  assert "spawned" in result.output
  assert result.status == ("timeout" if then == "hang" else "passed"), result
  assert not running(marker)
