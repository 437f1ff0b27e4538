import atexit
import os
import shutil
import tempfile

import jax
import pytest

from flash_dllm_jax import compilation

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
  if any(d.platform == "gpu" for d in jax.devices()):
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


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
