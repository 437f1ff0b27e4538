"""Command lines run as `python ARGV` would run them, many in one fresh
Python: a refusal costs its checks, not an interpreter and a JAX import
each."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.paths import ROOT

_RUNNER = r'''
import contextlib, io, json, runpy, sys
out = []
for argv in json.loads(sys.stdin.read()):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
      else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) or e.code is None else 1
      if not isinstance(e.code, (int, type(None))):
        print(e.code, file=sys.stderr)
  out.append([code or 0, err.getvalue()])
print(json.dumps(out))
'''


def run_in_one_python(argvs: list[list[str]], env: dict | None = None
                      ) -> list[tuple[int, str]]:
  """(exit status, stderr) of `python ARGV` for each argv (`-m MODULE ...`
  or `SCRIPT ...`), all in one fresh Python from the repository root, one
  after another."""
  r = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(argvs),
                     cwd=ROOT, capture_output=True, text=True, timeout=600,
                     env={**os.environ, "JAX_PLATFORMS": "cpu",
                          "PYTHONPATH": str(ROOT), **(env or {})})
  assert r.returncode == 0, r.stderr[-3000:]
  return [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]


def refusals(argvs: list[list[str]]) -> list[tuple[int, str]]:
  """run_in_one_python of `python -m flash_dllm_jax ARGV` per argv."""
  return run_in_one_python([["-m", "flash_dllm_jax", *a] for a in argvs])
