"""The CPU suite's XLA flags: backend optimisation level 0 and XLA:CPU's
elemental emitters for the whole run (compiling dominates it; tests/
conftest.py), XLA's default level 2 where a test's programs compute more
than they compile (the shipped model's uncached decodes, whose level-0 code
took 1.4 to 1.6 times the CPU time). The MLIR fusion emitters took about
half of a level-0 compile: four of the slowest modules ran in 145 s
without them, 259 s with them."""

import contextlib
import os

QUICK = "--xla_backend_optimization_level=0"
FULL = "--xla_backend_optimization_level=2"
ELEMENTAL = "--xla_cpu_use_fusion_emitters=false"
QUICK_FLAGS = f"{QUICK} {ELEMENTAL}"  # what the suite adds to XLA_FLAGS


def _quick_flags() -> str | None:
  """This run's XLA_FLAGS where they ask for level 0 (else None: a GPU
  machine, or flags the caller set)."""
  flags = os.environ.get("XLA_FLAGS", "")
  return flags if QUICK in flags.split() else None


@contextlib.contextmanager
def full_optimisation():
  """Level 2 inside the block for the decode loops compiled in this process
  (compilation.CPU_COMPILER_OPTIONS, a per-program option that JAX's
  persistent-cache key holds). XLA_FLAGS stay: the key also hashes them,
  and this process's other programs still compile at level 0."""
  import pytest
  from flash_dllm_jax import compilation
  if _quick_flags() is None:
    yield
    return
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(compilation.CPU_COMPILER_OPTIONS,
               "xla_backend_optimization_level", 2)
    yield


def full_optimisation_env() -> dict:
  """The environment changes that start a command at level 2 (this run's
  XLA_FLAGS with FULL for QUICK; {} where the run is not at level 0)."""
  flags = _quick_flags()
  return {} if flags is None else {"XLA_FLAGS": flags.replace(QUICK, FULL)}


@contextlib.contextmanager
def fusion_emitters():
  """XLA:CPU's default (MLIR fusion) emitters inside the block for the
  programs compiled through compilation.CPU_COMPILER_OPTIONS and for the
  commands started there: a claim that
  two different programs round alike (the server's log-probabilities and
  generate's) is a claim about XLA's defaults; the elemental emitters
  round some of them apart in the last bit."""
  import pytest
  from flash_dllm_jax import compilation
  if _quick_flags() is None:
    yield
    return
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(compilation.CPU_COMPILER_OPTIONS,
               "xla_cpu_use_fusion_emitters", True)
    # and for the commands started inside the block (a test's server)
    mp.setenv("XLA_FLAGS", " ".join(
        f for f in os.environ["XLA_FLAGS"].split() if f != ELEMENTAL))
    yield
