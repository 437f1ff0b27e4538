"""Runs untrusted programs (model-written code) in separate subprocesses.

Each program runs in a fresh `python -I` child in its own temporary working
directory, with a minimal environment and limits: address space
(RLIMIT_AS), CPU seconds (RLIMIT_CPU), file size, no core dumps, and a
process count. A wall-clock timeout ends the run. The child also disables a
few destructive os/shutil/subprocess calls before running the program.

Two sandboxes (`Limits.sandbox`; 'auto' picks the first that works here):
  bwrap: bubblewrap, when installed and able to create namespaces: no
    network (a new network namespace), a read-only file system except the
    temporary directory (and a private /tmp, where only the interpreter's
    own folders are kept, read-only), its own PID namespace, so
    every process the program starts, in any session, dies with it.
  rlimit: the limits alone; the process group is killed at the end, and a
    program can still reach the network and write where the evaluator may.
In both, where a writable cgroup `pids` controller exists (e.g. as root in
a container), each run gets its own cgroup: at most `processes` processes
(RLIMIT_NPROC does not bind root), and every process in it is killed at the
end, setsid escapes included. Without bwrap, cgroups or a non-root user, a
fork bomb is bounded only by the timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from flash_dllm_jax.eval import sandbox

# Runs inside the child: limits first, then the guard, then the program; the
# random token written after it proves the program ran to its end (a
# sys.exit(0) or os._exit(0) before the tests finish is not a pass).
_BOOTSTRAP = r"""
import resource, sys
mem, cpu, fsize, nproc = (int(x) for x in sys.argv[1:5])
token = sys.argv[5]
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
source = open("program.py", encoding="utf-8").read()
import os, shutil, subprocess
for name in ("system", "kill", "killpg", "fork", "forkpty", "remove", "unlink",
             "rmdir", "removedirs", "rename", "renames", "replace", "truncate",
             "putenv", "chdir", "fchdir", "setuid", "setgid"):
  if hasattr(os, name):
    setattr(os, name, None)
shutil.rmtree = shutil.move = subprocess.Popen = None
sys.argv = ["program.py"]
exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
with open("finished", "w") as f:
  f.write(token)
"""

TAIL_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class Limits:
  """timeout_s: wall seconds (CPU seconds are capped at its ceiling too);
  memory_mb: address-space limit; file_mb: largest file it may write;
  processes: most processes (and threads, for RLIMIT_NPROC) at once;
  sandbox: 'bwrap', 'rlimit' or 'auto' (bwrap where it works)."""

  timeout_s: float = 10.0
  memory_mb: int = 1024
  file_mb: int = 16
  processes: int = 64
  sandbox: str = "auto"

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
class ExecResult:
  """status: 'passed' (exit 0), 'failed' (an exception or nonzero exit),
  'timeout' (wall or CPU limit) or 'killed' (another signal); detail: the
  error's last line or the signal; output: the tail of stdout + stderr."""

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


def _classify(code: int | None, timed_out: bool, finished: bool,
              stderr: str) -> tuple[str, str]:
  if timed_out:
    return "timeout", "wall-clock timeout"
  if code == 0:
    if finished:
      return "passed", ""
    return "failed", "exited with status 0 before the tests finished"
  if code is not None and code < 0:
    if -code == signal.SIGXCPU:
      return "timeout", "CPU time limit"
    try:
      return "killed", f"killed by {signal.Signals(-code).name}"
    except ValueError:
      return "killed", f"killed by signal {-code}"
  lines = [l for l in stderr.strip().splitlines() if l.strip()]
  return "failed", lines[-1] if lines else f"exit status {code}"


def run_program(source: str, limits: Limits = Limits()) -> ExecResult:
  """Runs `source` as a script in a sandboxed child process; never raises
  for anything the program does."""
  t0 = time.perf_counter()
  mode = sandbox.sandbox_mode(limits.sandbox)
  with tempfile.TemporaryDirectory(prefix="fdj-exec-") as tmp, \
       sandbox.pids_cgroup(limits.processes) as cgroup:
    work, token = Path(tmp), secrets.token_hex(16)
    (work / "program.py").write_text(source, encoding="utf-8")
    env = {"PATH": os.defpath, "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
    args = [sys.executable, "-I", "-c", _BOOTSTRAP,
            str(limits.memory_mb * 2**20), str(math.ceil(limits.timeout_s)),
            str(limits.file_mb * 2**20), str(limits.processes), token]
    if mode == "bwrap":
      args = sandbox.bwrap_args(work) + args
    if cgroup is not None:  # joins the cgroup, then becomes the child
      args = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
              str(cgroup / "cgroup.procs"), *args]
    with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
      proc = subprocess.Popen(args, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                              stdout=out, stderr=err, start_new_session=True)
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
    stderr = _tail(work / "stderr")
    done = work / "finished"
    finished = done.is_file() and done.read_text(errors="replace") == token
    status, detail = _classify(code, timed_out, finished, stderr)
    output = (_tail(work / "stdout") + stderr)[-TAIL_CHARS:]
  return ExecResult(status, detail, output, time.perf_counter() - t0)


def run_programs(sources: Sequence[str], limits: Limits = Limits(),
                 workers: int | None = None) -> list[ExecResult]:
  """run_program over many sources, `workers` children at a time (default:
  the CPU count), results in input order."""
  workers = workers or os.cpu_count() or 1
  if not isinstance(workers, int) or workers < 1:
    raise ValueError(f"workers must be a positive int, got {workers!r}")
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(lambda s: run_program(s, limits), sources))
