"""Data-parallel decoding on forced host devices gives the one-device tokens."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flash_dllm_jax.parallel import parse_mesh

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import jax, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
assert len(jax.devices()) == 4, jax.devices()
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling import DreamSampler, FastDLLMSampler, LLaDASampler
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests.test_sampling import random_prompts, tiny
cases = [
  ("llada", LLaDASampler(gen_length=16, steps=8, block_length=8)),
  ("llada", LLaDASampler(gen_length=16, steps=16, temperature=0.7)),
  ("dream", DreamSampler(gen_length=16, steps=8, alg="entropy")),
  ("llada", FastDLLMSampler(gen_length=16, block_length=8, cache="dual")),
  ("dream", FlashDLLMSampler(gen_length=16, block_m=4, track_num=2,
                             mask_num=2, threshold=0.6)),
  ("llada", FlashDLLMSampler(gen_length=16, block_m=4, track_num=2,
                             mask_num=2, threshold=0.9, verify=True,
                             gamma=0.4)),
]
prompts = random_prompts(50, [4, 13, 9, 30, 6, 11])  # 6 rows: padded to 8
for arch, sampler in cases:
  config, params = tiny(arch, eos_boost=1.2)
  one = generate(params, prompts, config=config, sampler=sampler, seed=5)
  for spec in ["data=4", "data=2"]:
    out = generate(params, prompts, config=config, sampler=sampler, seed=5,
                   mesh=spec)
    np.testing.assert_array_equal(out.tokens_BxG, one.tokens_BxG)
    np.testing.assert_array_equal(out.forwards_B, one.forwards_B)
print("MESH-OK", len(cases))
'''


def test_data_parallel_mesh_gives_the_same_tokens():
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "MESH-OK 6" in result.stdout


@pytest.mark.parametrize("spec,message", [
    ("data=0", "bad mesh spec"), ("rows=2", "bad mesh spec"),
    ("data=2,model=2", "not implemented"), ("data=64", "devices")])
def test_bad_mesh_specs(spec, message):
  with pytest.raises(ValueError, match=message):
    parse_mesh(spec)
