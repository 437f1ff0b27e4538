"""The MoE layer on the CPU's dense path: the routed experts (dense
products, each pair taking its expert's row, C experts at a time) against
the float32 reference, row and chunk invariance, and the router."""

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params, moe
from flash_dllm_jax.moe_config import MoEConfig
from flash_dllm_jax.ops import experts


def _layer(config):
  params = init_params(config, jax.random.key(1))["layers_1"]["moe"]
  rng = np.random.default_rng(0)
  # a decisive router and a non-zero bias, so that groups and bias matter
  params = {**params, "router": params["router"] * 40.0,
            "expert_bias": jnp.asarray(rng.normal(0, 0.1, 8), jnp.float32)}
  return params


def _apply(config, params, n_BxQxE):
  layer = moe.MoE(config, jnp.float32)
  return layer.apply({"params": params}, n_BxQxE, jnp.zeros_like(n_BxQxE))


def test_sparse_experts_equal_the_dense_reference():
  config = ModelConfig.tiny("llada2")
  params = _layer(config)
  n = jnp.asarray(np.random.default_rng(1).normal(size=(3, 7, 64)),
                  jnp.float32)
  with jax.default_matmul_precision("highest"):
    got = jax.jit(lambda p, x: _apply(config, p, x))(params, n)
  want = moe.dense_reference(params, config, n)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5,
                             atol=2e-5)


def test_a_row_does_not_depend_on_the_rows_routed_beside_it():
  """Bit for bit: a token alone, among others, and in another order."""
  config = ModelConfig.tiny("llada2", dtype="bfloat16")
  params = jax.tree.map(lambda a: a.astype(jnp.bfloat16)
                        if a.dtype == jnp.float32 and a.ndim == 3 else a,
                        _layer(config))
  x = jnp.asarray(np.random.default_rng(2).normal(size=(1, 12, 64)),
                  jnp.bfloat16)
  run = jax.jit(lambda p, x: _apply(config, p, x))
  full = np.asarray(run(params, x), np.float32)
  alone = np.asarray(run(params, x[:, 5:6]), np.float32)
  np.testing.assert_array_equal(full[:, 5:6], alone)
  order = np.random.default_rng(3).permutation(12)
  shuffled = np.asarray(run(params, x[:, order]), np.float32)
  np.testing.assert_array_equal(shuffled, full[:, order])


def test_router_limits_the_choice_to_the_best_groups():
  cfg = MoEConfig(n_experts=8, top_k=2, hidden=4, n_groups=4, topk_groups=1,
                  routed_scaling=2.0)
  logits = jnp.asarray([[0., 0., 3., -9., 2.9, 2.9, 0., 0.]])
  ids, weights = moe.route(cfg, logits, jnp.zeros(8))
  # group (4, 5) sums 2 x sigmoid(2.9) > group (2, 3)'s sigmoid(3) + ~0
  assert sorted(ids[0].tolist()) == [4, 5]
  np.testing.assert_allclose(np.asarray(weights), [[1.0, 1.0]], rtol=1e-6)
  # the bias moves the choice, not the weights
  bias = jnp.zeros(8).at[2].set(5.0).at[3].set(5.0)
  ids, weights = moe.route(cfg, logits, bias)
  assert sorted(ids[0].tolist()) == [2, 3]
  s = jax.nn.sigmoid(jnp.asarray([3.0, -9.0]))
  np.testing.assert_allclose(np.asarray(weights[0]),
                             np.asarray(2.0 * s / s.sum()), rtol=1e-6)


def test_experts_run_in_chunks_give_the_same_bits(monkeypatch):
  """Experts run C at a time (EXPERT_CHUNK_BYTES; C = 1, 2, all 8) give
  the bits of one pass: each pair takes its one chunk's value."""
  config = ModelConfig.tiny("llada2", dtype="bfloat16")
  params = jax.tree.map(lambda a: a.astype(jnp.bfloat16)
                        if a.dtype == jnp.float32 and a.ndim == 3 else a,
                        _layer(config))
  x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 6, 64)),
                  jnp.bfloat16)
  outs = []
  for chunk in (8, 2, 1):  # experts per chunk of [T = 12, C, E = 64]
    monkeypatch.setattr(experts, "EXPERT_CHUNK_BYTES", 12 * chunk * 64 * 4)
    outs.append(np.asarray(jax.jit(lambda p, x: _apply(config, p, x))(
        params, x), np.float32))
  np.testing.assert_array_equal(outs[1], outs[0])
  np.testing.assert_array_equal(outs[2], outs[0])
