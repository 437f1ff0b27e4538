"""The CPU suite's XLA backend optimisation level: 0 for the whole run
(compiling dominates it; tests/conftest.py), XLA's default 2 where a test's
programs compute more than they compile (the shipped model's decodes, whose
level-0 code took 1.4 to 1.6 times the CPU time)."""

import contextlib
import os

QUICK = "--xla_backend_optimization_level=0"
FULL = "--xla_backend_optimization_level=2"


@contextlib.contextmanager
def full_optimisation():
  """Level 2 inside the block for the decode loops compiled in this process
  (compilation.CPU_COMPILER_OPTIONS, a per-program option) and every command
  started (XLA_FLAGS): comparisons inside are between programs of one
  level. Nothing changes where the run is not at level 0 (a GPU machine)."""
  import pytest
  from flash_dllm_jax import compilation
  flags = os.environ.get("XLA_FLAGS", "")
  if QUICK not in flags.split():
    yield
    return
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(compilation.CPU_COMPILER_OPTIONS,
               "xla_backend_optimization_level", 2)
    mp.setenv("XLA_FLAGS", flags.replace(QUICK, FULL))
    yield
