"""Where `executor` confines a program: bubblewrap (`bwrap_args`, when
`bwrap_problem` finds none) or the limits alone, plus a `pids` cgroup where
this process may create one (`pids_cgroup`). The executor's docstring says
what each sandbox guarantees."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOXES = ("auto", "bwrap", "rlimit")


def _interpreter_under_tmp() -> list[Path]:
  """The interpreter's folders that the private /tmp would hide (a virtual
  environment, or a Python, installed under /tmp)."""
  named = {Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix,
                             sys.base_exec_prefix, Path(sys.executable).parent)}
  under = {p for p in named | {p.resolve() for p in named}
           if p.is_relative_to("/tmp") and p != Path("/tmp")}
  return sorted(p for p in under  # the outermost ones: a bind covers its tree
                if not any(p != q and p.is_relative_to(q) for q in under))


def bwrap_args(work: Path) -> list[str]:
  """bubblewrap: every namespace new (no network, own PIDs), the host file
  system read-only, a private /tmp (the interpreter's own folders kept,
  read-only), only `work` writable."""
  keep = [a for p in _interpreter_under_tmp()
          for a in ("--ro-bind", str(p), str(p))]
  return [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/",
          "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *keep,
          "--bind", str(work), str(work), "--chdir", str(work),
          "--unshare-all", "--die-with-parent", "--new-session",
          "--cap-drop", "ALL", "--"]


@functools.cache
def bwrap_problem() -> str | None:
  """Why bubblewrap cannot sandbox here (not installed, or namespaces not
  allowed), or None when it can."""
  if shutil.which("bwrap") is None:
    return "bwrap is not installed (Debian package bubblewrap)"
  with tempfile.TemporaryDirectory(prefix="fdj-probe-") as tmp:
    try:
      r = subprocess.run([*bwrap_args(Path(tmp)), sys.executable, "-I",
                          "-c", "pass"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
      return f"bwrap cannot start a sandbox here: {e}"
  if r.returncode:
    return f"bwrap cannot start a sandbox here: {r.stderr.strip()}"
  return None


def sandbox_mode(requested: str = "auto") -> str:
  """The sandbox a run with Limits(sandbox=requested) gets."""
  problem = bwrap_problem() if requested != "rlimit" else None
  if requested == "bwrap" and problem:
    raise ValueError(f"sandbox 'bwrap' was asked for, but {problem}")
  if problem:
    _say_fallback(problem)
  return "rlimit" if requested == "rlimit" or problem else "bwrap"


@functools.cache
def _say_fallback(problem: str) -> None:
  print(f"warning: test programs run in the rlimit sandbox (network and "
        f"writes not confined): {problem}", file=sys.stderr)


_PIDS_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup",
               "/sys/fs/cgroup/unified")


@functools.cache
def pids_cgroup_root() -> Path | None:
  """A cgroup hierarchy (v1 or v2) where this process may create children
  with a `pids` controller, or None."""
  for root in map(Path, _PIDS_ROOTS):
    probe = root / f"fdj-probe-{os.getpid()}"
    try:
      probe.mkdir()
    except OSError:
      continue
    ok = (probe / "pids.max").is_file() and (probe / "cgroup.procs").is_file()
    probe.rmdir()
    if ok:
      return root
  return None


@contextlib.contextmanager
def pids_cgroup(processes: int):
  """A fresh cgroup of at most `processes` processes (None without one);
  every process left in it is killed and the cgroup removed at the end."""
  root = pids_cgroup_root()
  if root is None:
    yield None
    return
  path = root / f"fdj-exec-{secrets.token_hex(8)}"
  path.mkdir()
  try:
    (path / "pids.max").write_text(str(processes))
    yield path
  finally:
    for _ in range(1000):
      pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
      if not pids:
        break
      for pid in pids:
        with contextlib.suppress(ProcessLookupError):
          os.kill(pid, signal.SIGKILL)
      time.sleep(0.01)
    for _ in range(100):
      try:
        path.rmdir()
        break
      except OSError:
        time.sleep(0.01)
