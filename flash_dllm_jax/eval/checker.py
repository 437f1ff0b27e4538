"""The trusted side of one test run, inside the sandbox. Standard library
only (the sandbox sees none of this project); the executor runs this file's
text as `python -I -c TEXT VERDICT_FD MEM CPU FSIZE NPROC`, then sends the
job (an executor.Check as JSON) over VERDICT_FD, a socket.

It forks the candidate process first, before it has read the job, so the
candidate's memory never held the tests; the candidate then receives only
its source and the entry point's name over its call pipe, runs the code and
answers calls of its entry point, one JSON line each way. The job is read
here only after the fork, and the tests run here, with `candidate` a proxy
for those calls whose replies are decoded into plain data (never unpickled:
no object of the candidate's crosses). Nothing of the job is in a file. The
verdict goes back over VERDICT_FD (/proc cannot reopen a socket), which the
candidate process closes before any of its code runs. This process makes
itself non-dumpable, so a process of the same user without CAP_SYS_PTRACE
can neither trace it, read its memory nor take its file descriptors
(/proc, pidfd_getfd). Nothing the candidate can write, print or exit with
reads as a pass; only check() returning here does.
"""

import json
import os
import resource
import signal
import sys
import traceback

DETAIL_CHARS = 500
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
# Destructive calls disabled in the candidate process: a guard against
# accidents, not a security boundary (posix.* still reaches them).
_GUARDED = ("system", "kill", "killpg", "fork", "forkpty", "remove", "unlink",
            "rmdir", "removedirs", "rename", "renames", "replace", "truncate",
            "putenv", "chdir", "fchdir", "setuid", "setgid")


class CandidateError(BaseException):
  """A call the candidate did not answer with a value: args (status,
  detail). A BaseException, so a test's `except Exception` cannot hide it."""


def encode(value):
  """Plain data as JSON: None, bool, int, float, str as themselves; lists,
  tuples, sets, frozensets, dicts and bytes as [kind, payload]."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value  # json writes subclasses as their base's text
  for kind, cls in _SEQUENCES.items():
    if isinstance(value, cls):
      return [kind, [encode(v) for v in value]]
  if isinstance(value, dict):
    return ["dict", [[encode(k), encode(v)] for k, v in value.items()]]
  if isinstance(value, (bytes, bytearray)):
    return ["bytes", bytes(value).hex()]
  if hasattr(type(value), "__index__"):  # numpy integers, say
    return int(value.__index__())
  raise TypeError(f"a {type(value).__name__} cannot cross the sandbox "
                  "(plain data only)")


def decode(obj):
  """encode's inverse on parsed JSON; ValueError for anything else."""
  if obj is None or type(obj) in (bool, int, float, str):
    return obj
  if type(obj) is list and len(obj) == 2:
    kind, payload = obj
    if kind in _SEQUENCES and type(payload) is list:
      return _SEQUENCES[kind](decode(v) for v in payload)
    if kind == "dict" and type(payload) is list:
      return {decode(k): decode(v) for k, v in payload}
    if kind == "bytes" and type(payload) is str:
      return bytes.fromhex(payload)
  raise ValueError("not plain data")


def describe(e: BaseException) -> str:
  text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
  return " ".join(text.split())[:DETAIL_CHARS]


def _send(out, message) -> None:
  _write(out, json.dumps(message))


def _write(out, line: str) -> None:
  for stream in (sys.stdout, sys.stderr):  # the program's output first
    try:
      stream.flush()
    except Exception:
      pass
  out.write(line + "\n")
  out.flush()


def _candidate(requests, replies) -> None:
  """The candidate process: its source and entry point (the first call
  line, all it is given), its code, then one reply per call."""
  import shutil
  import subprocess
  for name in _GUARDED:
    if hasattr(os, name):
      setattr(os, name, None)
  shutil.rmtree = shutil.move = subprocess.Popen = None
  sys.argv = ["program.py"]
  try:
    source, entry_point = json.loads(requests.readline())
    namespace = {"__name__": "__main__"}
    exec(compile(source, "program.py", "exec"), namespace)
    if entry_point not in namespace:
      raise NameError(f"name {entry_point!r} is not defined")
    function = namespace[entry_point]
    _send(replies, ["ok", None])
  except BaseException as e:
    _send(replies, ["error", describe(e)])
    return
  for line in requests:
    try:
      args, kwargs = decode(json.loads(line))
      reply = json.dumps(["ok", encode(function(*args, **kwargs))])
    except BaseException as e:
      reply = json.dumps(["error", describe(e)])
    _write(replies, reply)


def _ended(pid: int) -> tuple[str, str]:
  """How the candidate process ended (waiting for it to)."""
  code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
  if code == 0:
    return "failed", "exited with status 0 before the tests finished"
  if code > 0:
    return "failed", f"exit status {code}"
  if -code == signal.SIGXCPU:
    return "timeout", "CPU time limit"
  try:
    return "killed", f"killed by {signal.Signals(-code).name}"
  except ValueError:
    return "killed", f"killed by signal {-code}"


def _reply(replies, pid: int):
  line = replies.readline()
  if not line:
    raise CandidateError(*_ended(pid))
  try:
    kind, value = json.loads(line)
    if kind == "ok":
      return decode(value)
  except Exception:
    kind = None
  if kind == "error" and isinstance(value, str):  # what the candidate raised
    raise CandidateError("failed", value[:DETAIL_CHARS])
  raise CandidateError("failed", "the candidate sent an unreadable reply")


def _test(job, pid: int, requests, replies) -> tuple[str, str]:
  """Runs check(candidate) here; (status, detail)."""
  def candidate(*args, **kwargs):
    try:
      _send(requests, encode([args, kwargs]))
    except OSError:
      raise CandidateError(*_ended(pid)) from None
    return _reply(replies, pid)

  try:
    _reply(replies, pid)  # its code ran
    namespace = {"__name__": "__check__"}
    exec(compile(job["context"], "context.py", "exec"), namespace)
    namespace[job["entry_point"]] = candidate  # tests may call it by name
    exec(compile(job["test"], "test.py", "exec"), namespace)
    namespace["check"](candidate)
  except CandidateError as e:
    return e.args
  except BaseException as e:
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if f.filename == "test.py"]
    return "failed", describe(e) + (f" (test line {lines[-1]})" * bool(lines))
  return "passed", ""


def _receive(fd: int) -> dict:
  """The job the executor sends over the socket (until it shuts down its
  writing side)."""
  chunks = []
  while chunk := os.read(fd, 1 << 16):
    chunks.append(chunk)
  return json.loads(b"".join(chunks).decode("utf-8"))


def _not_dumpable() -> None:
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def main() -> None:
  verdict_fd = int(sys.argv[1])
  mem, cpu, fsize, nproc = (int(x) for x in sys.argv[2:6])
  resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
  resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
  resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  _not_dumpable()
  (call_r, call_w), (reply_r, reply_w) = os.pipe(), os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      for fd in (verdict_fd, call_w, reply_r):
        os.close(fd)
      resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
      _candidate(os.fdopen(call_r), os.fdopen(reply_w, "w"))
    finally:
      os._exit(0)
  os.close(call_r)
  os.close(reply_w)
  job = _receive(verdict_fd)  # only now: the candidate never held it
  requests = os.fdopen(call_w, "w")
  try:
    _send(requests, [job["source"], job["entry_point"]])
  except OSError:
    pass  # it ended already; _test reports how
  verdict = _test(job, pid, requests, os.fdopen(reply_r))
  os.write(verdict_fd, json.dumps(verdict).encode())
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  os._exit(0)


if __name__ == "__main__":
  main()
