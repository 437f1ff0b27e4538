import os

import jax
import pytest

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


# In-process command-line tests must not turn on JAX's persistent
# compilation cache for every later test in the process (tests that check
# the cache run the CLI in a subprocess with their own directory).
os.environ.setdefault("FLASH_DLLM_JAX_CACHE_DIR", "off")
