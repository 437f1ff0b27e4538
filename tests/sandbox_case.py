"""What the sandbox tests share: the sandboxes that run here (the bwrap
ones need bubblewrap, Debian package bubblewrap, which CI installs; they
skip without it) and a look for processes a run left behind."""

import time
from pathlib import Path

import pytest

from flash_dllm_jax.eval import sandbox

NEEDS_BWRAP = pytest.mark.skipif(sandbox.bwrap_problem() is not None,
                                 reason=str(sandbox.bwrap_problem()))
MODES = [pytest.param("bwrap", marks=NEEDS_BWRAP), "rlimit"]
# Without bwrap a run's processes are bounded and all found again only
# through its own cgroup (or RLIMIT_NPROC, which does not bind root).
CONTAINED = sandbox.pids_cgroup_root() is not None


def running(marker: str, wait_s: float = 5.0) -> list[int]:
  """Live (not zombie) processes whose command line holds marker, after
  waiting up to wait_s for them to go."""
  deadline = time.time() + wait_s
  while True:
    pids = []
    for d in Path("/proc").iterdir():
      try:
        if (d.name.isdigit() and marker.encode() in (d / "cmdline").read_bytes()
            and "\nState:\tZ" not in (d / "status").read_text()):
          pids.append(int(d.name))
      except OSError:
        pass
    if not pids or time.time() > deadline:
      return pids
    time.sleep(0.1)
