"""Where `executor` confines a program: bubblewrap (`bwrap_args`, when
`bwrap_problem` finds none) or, asked for by name, the limits alone; plus a
`pids` cgroup where this process may create one (`pids_cgroup`).
docs/evaluation.md says what each guarantees."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOXES = ("bwrap", "rlimit")
# Mounted read-only (symlinks copied as symlinks); nothing else of the host
# is visible but the interpreter's own folders and the run's directory.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
          "/etc/ld.so.cache", "/etc/localtime")
SANDBOX_UID = 65534  # nobody, in the sandbox's own user namespace
RLIMIT_WARNING = (
    "warning: --sandbox rlimit limits memory, CPU time, file size and "
    "processes only: test programs can read and write the evaluating user's "
    "files, reach the network, signal the user's processes and read their "
    "memory (the evaluator's holds every task's tests); run as root, a "
    "program may also read the checker's memory or take its descriptors "
    "(ptrace, pidfd_getfd) and forge a pass")


def interpreter_folders() -> list[Path]:
  """The folders the interpreter needs (its prefixes, site-packages, the
  executable's folder; as named and resolved), outermost only, less those
  inside SYSTEM. A virtual environment inside a project tree is bound
  alone, not the project around it."""
  named = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
           Path(sys.executable).parent, *site.getsitepackages()}
  found = {p for p in map(Path, named) if p.is_dir()}
  found |= {p.resolve() for p in found}
  found = {p for p in found if p != Path("/")
           and not any(p.is_relative_to(s) for s in SYSTEM)}
  return sorted(p for p in found  # a bind covers its tree
                if not any(p != q and p.is_relative_to(q) for q in found))


def _system_args() -> list[str]:
  args = []
  for name in SYSTEM:
    if os.path.islink(name):
      args += ["--symlink", os.readlink(name), name]
    elif os.path.exists(name):
      args += ["--ro-bind", name, name]
  return args


@functools.cache
def _can_disable_userns(bwrap: str) -> bool:
  try:
    return "--disable-userns" in subprocess.run(
        [bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.TimeoutExpired):
    return False


def bwrap_args(work: Path) -> list[str]:
  """bubblewrap: every namespace new (user: uid/gid 65534 without
  capabilities; no network; own PIDs), SYSTEM and the interpreter's folders
  read-only on an otherwise empty read-only root, `work` the one writable
  folder (and the working directory)."""
  bwrap = shutil.which("bwrap") or "bwrap"
  keep = [a for p in interpreter_folders() for a in ("--ro-bind", p, p)]
  no_userns = ["--disable-userns"] if _can_disable_userns(bwrap) else []
  uid = str(SANDBOX_UID)
  return [bwrap, "--unshare-all", "--unshare-user", "--uid", uid, "--gid",
          uid, *no_userns, "--die-with-parent", "--new-session", "--cap-drop",
          "ALL", *_system_args(), *map(str, keep), "--dev", "/dev", "--proc",
          "/proc", "--bind", str(work), str(work), "--chdir", str(work),
          "--remount-ro", "/", "--"]


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


def sandbox_mode(requested: str = "bwrap") -> str:
  """The sandbox a run with Limits(sandbox=requested) gets: bwrap, or a
  ValueError saying why not; rlimit only by name, with RLIMIT_WARNING once."""
  if requested == "rlimit":
    _warn_rlimit()
    return "rlimit"
  problem = bwrap_problem()
  if problem:
    raise ValueError(
        f"generated code runs only in the bubblewrap sandbox, but {problem}; "
        "install it (apt-get install bubblewrap) or pass --sandbox rlimit "
        "for limits alone (no file, network or process isolation)")
  return "bwrap"


@functools.cache
def _warn_rlimit() -> None:
  print(RLIMIT_WARNING, file=sys.stderr)


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
