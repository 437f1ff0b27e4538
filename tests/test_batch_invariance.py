"""A row's tokens must not depend on how many rows share its batch, also past
the sizes where XLA:CPU would switch a reduction to another implementation
(a YNNPACK fusion from about 4096 rows; see compilation.CPU_COMPILER_OPTIONS).

The other batch-invariance tests run a handful of rows, below that size.
The two checks of that switch run at XLA's default flags, as users compile
(a fresh Python: the suite compiles at optimisation level 0).
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import decode_jit, generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.model.transformer import init_params
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.row_sampling import RowSampling, row_settings
from tests.mesh_case import run_script
from tests.test_sampling import random_prompts

# Flash-dLLM with verification, as in test_flash_dllm.SMALL_VERIFY.
VERIFY = FlashDLLMSampler(gen_length=24, block_m=4, track_num=2, mask_num=2,
                          threshold=0.9, verify=True, gamma=0.4)
ROWS, CHUNK = 96, 8  # 96 x 56 positions in the prefill: past the switch


def _bf16_tiny():
  """bfloat16, where the bf16 round trips inside RMSNorm matter; sharp
  logits (head scale 8) as in test_sampling.tiny."""
  config = ModelConfig.tiny("llada", dtype="bfloat16")
  return config, init_params(config, jax.random.key(7), head_init_scale=8.0)


DEFAULT_FLAGS_SCRIPT = r"""
import jax
jax.config.update("jax_default_matmul_precision", "highest")
from tests import test_batch_invariance as t
t.large_batch_equals_small_batches()
t.cpu_decode_has_no_ynnpack_fusion()
print("DEFAULT-FLAGS-OK")
"""


def test_large_batch_and_its_program_at_default_flags():
  assert "DEFAULT-FLAGS-OK" in run_script(DEFAULT_FLAGS_SCRIPT, devices=1,
                                          quick=False)


def large_batch_equals_small_batches():
  """96 prompts of one prompt-length bucket in one batch give every row the
  tokens, forwards and steps it gets in batches of 8 (before the fix row 31
  differed: its prefill ran through a YNNPACK RMSNorm in the large batch)."""
  config, params = _bf16_tiny()
  lengths = np.random.default_rng(5).integers(8, 33, ROWS).tolist()
  prompts = random_prompts(31, lengths)
  big = generate(params, prompts, config=config, sampler=VERIFY)
  for i in range(0, ROWS, CHUNK):
    small = generate(params, prompts[i:i + CHUNK], config=config,
                     sampler=VERIFY)
    np.testing.assert_array_equal(big.tokens_BxG[i:i + CHUNK],
                                  small.tokens_BxG, err_msg=f"rows {i}+")
    np.testing.assert_array_equal(big.forwards_B[i:i + CHUNK],
                                  small.forwards_B)
    np.testing.assert_array_equal(big.steps_B[i:i + CHUNK], small.steps_B)


def cpu_decode_has_no_ynnpack_fusion():
  """The compiled decode loop keeps every reduction in XLA's own loops at a
  batch size that would otherwise get YNNPACK fusions. Lowered with the
  arguments generate passes: the program of the 96-row batch above, which
  this test then finds compiled."""
  config, params = _bf16_tiny()
  ids, valid = left_pad(random_prompts(3, [20] * ROWS), config.pad_token_id)
  rng_B = jax.vmap(jax.random.key)(jnp.arange(ROWS, dtype=jnp.uint32))
  sampling = RowSampling.of(row_settings(VERIFY, None, ROWS))
  hlo = decode_jit.lower(params, jnp.asarray(ids), jnp.asarray(valid), rng_B,
                         sampling, config=config, sampler=VERIFY,
                         stop_at_eos=True, implementation=None,
                         logprobs=False).compile().as_text()
  assert "__ynn_fusion" not in hlo


@pytest.mark.parametrize("backend,want", [
    ("cpu", "CPU_COMPILER_OPTIONS"), ("gpu", "GPU_COMPILER_OPTIONS"),
    ("cuda", "GPU_COMPILER_OPTIONS"), ("tpu", None)])
def test_decode_loops_compile_with_their_backends_options(monkeypatch,
                                                          backend, want):
  """The wrapper asks jax.jit for the backend's batch-invariance options
  (GPU: cuBLAS GEMMs without autotuning, which gave a row the same bits at
  every probed row count on the H200 where XLA's defaults did not, and no
  dot merger, whose choice depended on the row count)."""
  gen = importlib.import_module("flash_dllm_jax.compilation")
  seen = {}

  def fake_jit(fn, static_argnames, compiler_options):
    seen.update(static=static_argnames, options=compiler_options)
    return lambda *a, **k: "ran"

  monkeypatch.setattr(gen.jax, "jit", fake_jit)
  monkeypatch.setattr(gen.jax, "default_backend", lambda: backend)
  wrapped = gen._BatchInvariantJit(lambda x: x, static_argnames=("a",))
  assert wrapped(1) == "ran"
  assert seen["static"] == ("a",)
  assert seen["options"] == (getattr(gen, want) if want else None)
  assert gen.compiler_options() is seen["options"]  # what the probes use
  assert gen.GPU_COMPILER_OPTIONS == {"xla_gpu_enable_triton_gemm": False,
                                      "xla_gpu_autotune_level": 0,
                                      "xla_gpu_dot_merger_threshold_mb": 0}
