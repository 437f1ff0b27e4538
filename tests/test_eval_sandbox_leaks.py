"""The candidate never sees its tests: each program below looks for the
test's secret where a candidate could (its working directory, its frames
and objects, its own memory, the checker's memory and descriptors) and
returns what it finds; the test asserts the secret, so a leak passes it.
A wrong body with the leak would pass every HumanEval problem."""

import os
import secrets
import textwrap

import pytest

from flash_dllm_jax.eval import executor
from tests.sandbox_case import MODES

FIND = textwrap.dedent("""\
    import gc, os, re, sys
    want = re.compile(rb"SECRET-[0-9]{12}")
    found = []
    def look(data):
        if isinstance(data, str):
            data = data.encode("utf-8", "replace")
        if isinstance(data, bytes):
            found.extend(m.decode() for m in want.findall(data))
    """)
LEAKS = {
    "files": "for root, _, names in os.walk('.'):\n"
             "    for n in names:\n        try:\n"
             "            look(open(os.path.join(root, n), 'rb').read())\n"
             "        except OSError:\n            pass\n",
    "frames": "frame = sys._getframe()\nwhile frame:\n"
              "    for scope in (frame.f_locals, frame.f_globals):\n"
              "        for v in list(scope.values()):\n"
              "            look(repr(v))\n    frame = frame.f_back\n",
    "objects": "for o in gc.get_objects():\n    if isinstance(o, dict):\n"
               "        look(repr(o)[:100000])\n"
               "for o in list(sys.modules.values()):\n"
               "    look(repr(getattr(o, '__dict__', '')))\n",
    "own_memory": "for line in open('/proc/self/maps'):\n"
                  "    span, perms = line.split()[:2]\n"
                  "    if 'r' not in perms:\n        continue\n"
                  "    lo, hi = (int(x, 16) for x in span.split('-'))\n"
                  "    with open('/proc/self/mem', 'rb', 0) as mem:\n"
                  "        for at in range(lo, hi, 1 << 20):\n"
                  "            try:\n                mem.seek(at)\n"
                  "                look(mem.read(min(1 << 20, hi - at) + 32))\n"
                  "            except (OSError, ValueError, OverflowError):\n"
                  "                break\n",
    "checker_memory": "pid = os.getppid()\ntry:\n"
                      "    maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
                      "except OSError:\n    maps = []\n"
                      "for line in maps:\n    span = line.split()[0]\n"
                      "    lo, hi = (int(x, 16) for x in span.split('-'))\n"
                      "    try:\n"
                      "        with open(f'/proc/{pid}/mem', 'rb', 0) as mem:\n"
                      "            mem.seek(lo)\n"
                      "            look(mem.read(min(hi - lo, 1 << 26)))\n"
                      "    except (OSError, ValueError, OverflowError):\n"
                      "        pass\n"
                      "for name in ('cmdline', 'environ'):\n    try:\n"
                      "        look(open(f'/proc/{pid}/{name}', 'rb').read())\n"
                      "    except OSError:\n        pass\n",
    # pidfd_getfd: the checker's descriptors (its socket would forge a pass)
    "checker_fds": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                   "try:\n    pidfd = os.pidfd_open(os.getppid())\n"
                   "except OSError:\n    pidfd = -1\n"
                   "for fd in range(3, 64):\n"
                   "    got = libc.syscall(438, pidfd, fd, 0)\n"
                   "    if got >= 0:\n"
                   "        found.append(f'took descriptor {fd}')\n",
}


def leak_check(leak: str, secret: str) -> executor.Check:
  body = textwrap.indent(FIND + LEAKS[leak], "    ")
  source = (f"def answer():\n{body}\n"
            "    return found[0] if found else 'nothing'\n")
  test = f"def check(candidate):\n    assert candidate() == {secret!r}\n"
  return executor.Check(source, test, "answer")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("leak", LEAKS)
def test_the_candidate_cannot_find_its_tests(mode, leak):
  if (mode == "rlimit" and leak.startswith("checker_")
      and os.geteuid() == 0):
    pytest.skip("under rlimit a root program may hold CAP_SYS_PTRACE and "
                "read the checker (the rlimit warning says so)")
  secret = f"SECRET-{secrets.randbelow(10**12):012d}"
  result = executor.run_check(leak_check(leak, secret),
                              executor.Limits(sandbox=mode, timeout_s=20))
  assert result.status == "failed", result
  assert "'nothing' == " in result.detail or "AssertionError" in \
      result.detail, result
  assert secret not in result.output + result.detail


def test_the_run_directory_holds_nothing_of_the_job():
  """The program lists its working directory: empty (no job file)."""
  check = executor.Check("import os\ndef f():\n    return os.listdir('.')\n",
                         "def check(c):\n    assert c() == []\n", "f")
  result = executor.run_check(check, executor.Limits(sandbox="rlimit"))
  assert result.passed, result
