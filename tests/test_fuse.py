"""One joined q/k/v projection (model/fuse.py) against the three stored
ones: the same forward, decode and Hugging Face loading, and its
tensor-parallel layout (whole heads per device)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flash_dllm_jax
from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import Transformer, init_params
from flash_dllm_jax.model.fuse import fuse_qkv, qkv_features
from tests import hf_fixtures

TINY = "checkpoints/tiny-random-llada"


def _logits(params, config, ids):
  """The uncached forward's logits, jitted (op by op it would compile every
  small program)."""
  pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  return jax.jit(Transformer(config).apply)(
      {"params": params}, ids, pos, jnp.ones(ids.shape, bool))[0]


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_joined_projection_gives_the_same_forward(arch):
  config = ModelConfig.tiny(arch, n_heads=4, n_kv_heads=2)
  params = init_params(config, jax.random.key(3))
  ids = jax.random.randint(jax.random.key(4), (2, 9), 0, config.vocab_size)
  with jax.default_matmul_precision("highest"):
    want = _logits(params, config, ids)
    joined, fused = fuse_qkv(jax.tree.map(jnp.copy, params), config)
    got = _logits(joined, fused, ids)
  assert fused.fused_qkv and "q_proj" not in joined["layers_0"]
  width = qkv_features(config)  # K * (J + 2) * D = 2 * 4 * 16
  assert joined["layers_0"]["qkv_proj"]["kernel"].shape == (64, width)
  assert ("bias" in joined["layers_0"]["qkv_proj"]) == config.qkv_bias
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-5)
  assert fuse_qkv(joined, fused)[1] is fused  # joining twice: a no-op


@pytest.mark.parametrize("strategy", ["flash-dllm", "elastic-cache"])
def test_decode_tokens_are_the_same(strategy):
  model = flash_dllm_jax.load(TINY, fuse_qkv=False)
  joined = flash_dllm_jax.load(TINY, fuse_qkv=True)
  assert not model[1].fused_qkv and joined[1].fused_qkv
  prompts = [[5, 9, 13, 2, 7], [3, 4]]
  run = lambda m: flash_dllm_jax.generate(
      m, prompts, strategy=strategy, gen_length=32, chat=False)
  a, b = run(model), run(joined)
  np.testing.assert_array_equal(a.tokens_BxG, b.tokens_BxG)


def test_load_joins_only_on_a_gpu_by_default(tmp_path):
  _, config, _ = flash_dllm_jax.load(TINY)
  assert config.fused_qkv == (jax.default_backend() in ("gpu", "cuda"))
  src, _ = hf_fixtures.write_dream(tmp_path / "hf", seed=1)
  params, config, _ = flash_dllm_jax.load(src, dtype="float32",
                                          fuse_qkv=True)
  assert config.fused_qkv and "qkv_proj" in params["layers_0"]


def test_tensor_parallel_spec_splits_whole_heads():
  config = ModelConfig.tiny("dream", fused_qkv=True)
  spec = parallel.param_spec(config, "layers_0/qkv_proj/kernel", (64, 128))
  assert spec == jax.sharding.PartitionSpec(None, "model")
  assert parallel.param_spec(config, "layers_0/qkv_proj/bias", (128,)) == (
      jax.sharding.PartitionSpec("model"))


@pytest.mark.parametrize("fmt", ["fp8", "int8-g128"])
def test_joined_8bit_projection_gives_the_same_forward(fmt):
  """8-bit kernels are [O, E] with [O, Z] scales: joined along O."""
  config = ModelConfig.tiny("dream", d_model=128, n_heads=4, n_kv_heads=2,
                            head_dim=32, dtype="bfloat16")
  from flash_dllm_jax import quantize
  config = config.replace(quantize=fmt)
  params = quantize.quantize_params(init_params(
      config.replace(quantize=None), jax.random.key(5)), config)
  ids = jax.random.randint(jax.random.key(6), (2, 7), 0, config.vocab_size)
  want = _logits(params, config, ids)
  joined, fused = fuse_qkv(jax.tree.map(jnp.copy, params), config)
  layer = joined["layers_0"]["qkv_proj"]
  assert layer["kernel_q"].shape[0] == qkv_features(config)
  assert layer["scale"].shape[0] == qkv_features(config)
  np.testing.assert_allclose(np.asarray(_logits(joined, fused, ids)),
                             np.asarray(want), rtol=2e-2, atol=2e-2)
