import atexit
import os
import shutil
import tempfile

# The CPU suite compiles at XLA's backend optimisation level 0 with XLA:CPU's
# elemental emitters (tests/compile_level.py): compiling dominates it, and
# every exactness claim compares programs compiled under the same flags
# (tests/mesh_case.py's default-flags scripts keep XLA's defaults; claims
# that two programs round alike use XLA's emitters: default_emitters).
# Not on a GPU machine, whose `gpu` tests time kernels.
from tests.compile_level import (QUICK_FLAGS, full_optimisation,  # no jax
                                 fusion_emitters)

if (shutil.which("nvidia-smi") is None
    and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " " + QUICK_FLAGS).strip()

import jax  # noqa: E402 -- after XLA_FLAGS
import pytest

from flash_dllm_jax import compilation

jax.config.update("jax_default_matmul_precision", "highest")


# The modules that took longest on 2 CPU cores, longest first (about a
# minute or more each). `-n 2 --dist loadfile` hands whole files to the
# workers in collection order (pytest_configure turns off xdist's reordering
# by test count, which queued these few-test modules last): starting them
# first leaves the many short modules to even out the two workers' ends.
SLOW_MODULES = (
    "test_llada21.py", "test_scripts.py", "test_sdar.py", "test_mesh_exact.py",
    "test_kv_cache_8bit.py", "test_diffusion_gemma_entry.py",
    "test_serve_diffusion_gemma.py", "test_readme.py",
    "test_sdar_entry_points.py",
    "test_flash_dllm.py", "test_mesh.py", "test_shipped_llada2.py",
    "test_llada2.py", "test_llada2_cache.py", "test_shipped_model.py",
    "test_training_runs.py", "test_sampler_options.py",
    "test_serve_shipped.py", "test_serve_variants.py",
    "test_serve_bench.py", "test_eval_quality.py",
    "test_elastic_cache_drift.py", "test_lm_eval_tasks.py",
    "test_mesh_diffusion_gemma.py", "test_kernel_attention_kv8.py",
    "test_serve_engine.py", "test_serve.py", "test_block_flash_shift.py",
    "test_diffusion_gemma_row_options.py", "test_diffusion_gemma_sampler.py",
    "test_diffusion_gemma_flash.py", "test_canvas_objective.py",
    "test_blockwise_attention.py", "test_flash_mesh.py")


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.6
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(SLOW_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
  if any(d.platform == "gpu" for d in jax.devices()):
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope="module")
def optimised():
  """XLA's default optimisation level for the decode loops of a module
  whose programs compute more than they compile (tests/compile_level.py)."""
  with full_optimisation():
    yield


@pytest.fixture(scope="module")
def default_emitters():
  """XLA:CPU's fusion emitters for a module's decode loops whose claims
  compare two programs' bits (tests/compile_level.py)."""
  with fusion_emitters():
    yield


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code():
  """Drops JAX's compiled executables after each test module.

  Every XLA:CPU executable keeps memory mappings alive; across the whole
  suite they grew past the kernel's vm.max_map_count (65530), and the next
  compilation then crashed inside LLVM (a segfault in test_training, seen
  on 2026-11-29). Nothing is shared across modules but the cost of
  recompiling."""
  yield
  import gc
  jax.clear_caches()
  gc.collect()


# One JAX persistent compilation cache per test run, shared by the xdist
# workers (they inherit the controller's environment) and every command the
# tests start: a program that one test, or one CLI subprocess, compiled is
# loaded by the next that builds it (jax.clear_caches() above forgets it in
# memory). Fresh per run, removed at exit, so no run sees another's
# executables; tests of the cache itself set their own directory.
if "FLASH_DLLM_JAX_TEST_CACHE" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="flash-dllm-jax-test-cache-")
  os.environ["FLASH_DLLM_JAX_TEST_CACHE"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ["FLASH_DLLM_JAX_CACHE_DIR"] = os.environ[
    "FLASH_DLLM_JAX_TEST_CACHE"]
compilation.enable_persistent_cache(os.environ["FLASH_DLLM_JAX_CACHE_DIR"])
