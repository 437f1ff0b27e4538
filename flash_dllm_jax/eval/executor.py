"""Runs untrusted code (model-written programs) against its tests, in
sandboxed subprocesses, never in this process.

A Check runs in a fresh `python -I` child in its own empty temporary
directory, under address-space, CPU-time, file-size and process-count
limits and a wall-clock timeout. That child (eval/checker.py) forks the
candidate process before it receives the job over a socket the candidate
never holds, gives the candidate only its source and entry point's name,
runs the tests itself on values the candidate returns as plain data, and
reports the verdict over the same socket.
`Limits.sandbox` picks the confinement (eval/sandbox.py): 'bwrap'
(bubblewrap: its own user, PID, network and mount namespaces, the host's
system folders and the interpreter read-only, nothing else of the host) or,
only when asked for by name, 'rlimit' (the limits alone). docs/evaluation.md
states what each guarantees.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from flash_dllm_jax.eval import sandbox

CHECKER = (Path(__file__).parent / "checker.py").read_text(encoding="utf-8")
# Processes a run needs besides the program's: the checker, and under bwrap
# its monitor and its namespace's init.
OVERHEAD = {"bwrap": 3, "rlimit": 1}
STATUSES = ("passed", "failed", "timeout", "killed")
TAIL_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class Limits:
  """timeout_s: wall seconds (CPU seconds are capped at its ceiling too);
  memory_mb: address-space limit; file_mb: largest file it may write;
  processes: most processes of the program (and threads, for RLIMIT_NPROC)
  at once; sandbox: 'bwrap' or 'rlimit'."""

  timeout_s: float = 10.0
  memory_mb: int = 1024
  file_mb: int = 16
  processes: int = 64
  sandbox: str = "bwrap"

  def __post_init__(self):
    if not (isinstance(self.timeout_s, (int, float))
            and math.isfinite(self.timeout_s) and self.timeout_s > 0):
      raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
    if not isinstance(self.memory_mb, int) or self.memory_mb < 64:
      raise ValueError(f"memory limit must be an int >= 64 MB, "
                       f"got {self.memory_mb!r}")
    if not isinstance(self.file_mb, int) or self.file_mb < 1:
      raise ValueError(f"file size limit must be an int >= 1 MB, "
                       f"got {self.file_mb!r}")
    if not isinstance(self.processes, int) or self.processes < 1:
      raise ValueError(f"process limit must be an int >= 1, "
                       f"got {self.processes!r}")
    if self.sandbox not in sandbox.SANDBOXES:
      raise ValueError(f"sandbox must be one of {sandbox.SANDBOXES}, "
                       f"got {self.sandbox!r}")


@dataclasses.dataclass(frozen=True)
class Check:
  """One test run: `source` runs in the candidate process and defines
  `entry_point`; `context` then `test` run in the checker, and `test`'s
  check(candidate) passes iff it returns (candidate: a proxy calling
  entry_point in the candidate process; arguments and results plain data:
  None, bool, int, float, str, bytes, lists, tuples, sets, dicts)."""

  source: str
  test: str
  entry_point: str
  context: str = ""

  def __post_init__(self):
    for name in ("source", "test", "entry_point", "context"):
      if not isinstance(getattr(self, name), str):
        raise ValueError(f"Check.{name} must be a str")
    if not self.entry_point.isidentifier():
      raise ValueError(f"entry point must be an identifier, "
                       f"got {self.entry_point!r}")


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """status: 'passed' (check() returned), 'failed' (an exception, a
  non-plain result or an early exit), 'timeout' (wall or CPU limit) or
  'killed' (another signal); detail: the error or the signal, one line;
  output: the tail of stdout + stderr."""

  status: str
  detail: str
  output: str
  seconds: float

  @property
  def passed(self) -> bool:
    return self.status == "passed"


def _tail(path: Path) -> str:
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - TAIL_CHARS))
    return f.read().decode("utf-8", "replace")


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _signalled(signum: int) -> tuple[str, str]:
  if signum == signal.SIGXCPU:
    return "timeout", "CPU time limit"
  try:
    return "killed", f"killed by {signal.Signals(signum).name}"
  except ValueError:
    return "killed", f"killed by signal {signum}"


def _verdict(channel: socket.socket, code: int | None, timed_out: bool,
             stderr: str) -> tuple[str, str]:
  """From the checker's message, else from how the checker ended."""
  if timed_out:
    return "timeout", "wall-clock timeout"
  channel.setblocking(False)
  try:
    status, detail = json.loads(channel.recv(1 << 16))
    if status in STATUSES and isinstance(detail, str):
      return status, detail
  except (BlockingIOError, ValueError, TypeError):
    pass
  if code is not None and code < 0:
    return _signalled(-code)
  lines = [l for l in stderr.strip().splitlines() if l.strip()]
  return "failed", lines[-1] if lines else f"exit status {code}"


def _send_job(channel: socket.socket, check: Check, timeout_s: float) -> None:
  """The job, to the checker (which reads it once the candidate process is
  forked); a checker that died early is reported by how it ended."""
  channel.settimeout(timeout_s)
  try:
    channel.sendall(json.dumps(dataclasses.asdict(check)).encode("utf-8"))
    channel.shutdown(socket.SHUT_WR)
  except OSError:
    pass


def run_check(check: Check, limits: Limits = Limits()) -> ExecResult:
  """Runs `check` in a sandboxed child process; never raises for anything
  the code does (ValueError when the sandbox cannot run here)."""
  t0 = time.perf_counter()
  mode = sandbox.sandbox_mode(limits.sandbox)
  with tempfile.TemporaryDirectory(prefix="fdj-exec-") as tmp, \
       sandbox.pids_cgroup(limits.processes + OVERHEAD[mode]) as cgroup:
    logs, box = Path(tmp), Path(tmp) / "box"  # the program sees box only
    box.mkdir()  # stays empty but for what the program writes
    env = {"PATH": os.defpath, "HOME": str(box), "TMPDIR": str(box),
           "LANG": "C.UTF-8"}
    # A socket, not a pipe: /proc/PID/fd cannot reopen it.
    channel, checker_end = socket.socketpair()
    args = [sys.executable, "-I", "-c", CHECKER, str(checker_end.fileno()),
            str(limits.memory_mb * 2**20), str(math.ceil(limits.timeout_s)),
            str(limits.file_mb * 2**20), str(limits.processes)]
    if mode == "bwrap":
      args = sandbox.bwrap_args(box) + args
    if cgroup is not None:  # joins the cgroup, then becomes the child
      args = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
              str(cgroup / "cgroup.procs"), *args]
    try:
      with open(logs / "stdout", "wb") as out, \
           open(logs / "stderr", "wb") as err:
        try:
          proc = subprocess.Popen(args, cwd=box, env=env, stdout=out,
                                  stderr=err, stdin=subprocess.DEVNULL,
                                  pass_fds=(checker_end.fileno(),),
                                  start_new_session=True)
        finally:
          checker_end.close()  # the checker holds the only other end
        _send_job(channel, check, limits.timeout_s)
        timed_out = False
        try:
          proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
          timed_out = True
        finally:
          _kill_group(proc.pid)  # also whatever the program left behind
          proc.wait()
      code = proc.returncode
      if mode == "bwrap" and code > 128:  # bwrap: 128 + the child's signal
        code = 128 - code
      stderr = _tail(logs / "stderr")
      status, detail = _verdict(channel, code, timed_out, stderr)
    finally:
      channel.close()
    output = (_tail(logs / "stdout") + stderr)[-TAIL_CHARS:]
  return ExecResult(status, detail, output, time.perf_counter() - t0)


def run_checks(checks: Sequence[Check], limits: Limits = Limits(),
               workers: int | None = None) -> list[ExecResult]:
  """run_check over many checks, `workers` children at a time (default:
  the CPU count), results in input order."""
  workers = workers or os.cpu_count() or 1
  if not isinstance(workers, int) or workers < 1:
    raise ValueError(f"workers must be a positive int, got {workers!r}")
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(lambda c: run_check(c, limits), checks))
