"""LLaDA2 training: the block-diffusion objective, expert balancing, the
LLaDA2-format corpus tokenizer.

Oracles: the sampler's own view of a block (clean earlier blocks, the noised
block, the model's block-causal mask, nothing after) must give the two-copy
forward's logits; the mask restated with loops; the bias step's direction.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.tokenizer_builder import build_tokenizer, corpus_texts
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import Transformer, init_params
from flash_dllm_train.balance import balance_experts, expert_imbalance
from flash_dllm_train.block_objective import two_copy_logits, two_copy_mask
from flash_dllm_train.config import TrainConfig, make_optimizer
from flash_dllm_train.data import encode_problems, rows_batch
from flash_dllm_train.objective import loss_fn, noise_tokens, positions_of
from flash_dllm_train.train import TrainState, make_steps

BLOCK = 8


@pytest.fixture(scope="module")
def setup():
  problems = [p for p in sg.generate(200, 0) if p["steps"] == 2]
  tok, ids = build_tokenizer(corpus_texts(problems), 512, arch="llada2")
  config = ModelConfig.tiny("llada2", vocab_size=512, **ids)
  rows = encode_problems(problems, tok, 160)
  params = init_params(config, jax.random.key(0), param_dtype="float32")
  return tok, config, rows, params


def test_corpus_tokenizer_is_llada2_format(setup):
  tok, config, _, _ = setup
  assert tok.mask_id == tok.backend.token_to_id("<|mask|>") == \
      config.mask_token_id
  assert tok.eot_id == tok.backend.token_to_id("<|role_end|>")
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                 add_generation_prompt=True)
  assert text == ("<role>SYSTEM</role>detailed thinking off<|role_end|>"
                  "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>")


def test_two_copy_mask_restated():
  valid = np.array([[1, 1, 1, 1, 1, 0]], bool)
  blocks = np.array([[0, 0, 1, 1, 2, 2]])
  got = np.asarray(two_copy_mask(jnp.asarray(valid), jnp.asarray(blocks)))
  n = valid.shape[1]
  want = np.zeros((1, 2 * n, 2 * n), bool)
  for i in range(2 * n):
    for j in range(2 * n):
      qi, kj = i % n, j % n
      if not valid[0, kj]:
        continue
      if i < n and j < n:  # noised sees its own block
        want[0, i, j] = blocks[0, kj] == blocks[0, qi]
      elif i < n:  # noised sees clean earlier blocks
        want[0, i, j] = blocks[0, kj] < blocks[0, qi]
      elif j >= n:  # clean sees clean up to its block
        want[0, i, j] = blocks[0, kj] <= blocks[0, qi]
  np.testing.assert_array_equal(got, want)


def test_two_copy_logits_are_the_samplers_view(setup):
  """Block b's noised logits in the two-copy forward = the model run on
  clean blocks < b then the noised block b under its block-causal mask."""
  _, config, rows, params = setup
  batch = rows_batch(rows, np.arange(3))
  tokens = jnp.asarray(batch["tokens_BxN"])
  valid = jnp.asarray(batch["valid_BxN"], bool)
  response = valid & ~jnp.asarray(batch["prompt_BxN"], bool)
  u = jax.random.uniform(jax.random.key(3), tokens.shape)
  noisy, masked = noise_tokens(tokens, response, jnp.full((3,), 0.6), u,
                               config.mask_token_id)
  assert bool(masked.any())
  pos = positions_of(valid)
  model = Transformer(config, implementation="reference")
  both, _ = jax.jit(lambda *a: two_copy_logits(model, *a, BLOCK))(
      params, noisy, tokens, pos, valid)
  n = tokens.shape[1]
  first = int(np.min(np.argmax(np.asarray(response), axis=1))) // BLOCK
  forward = jax.jit(lambda p, x, q, v: model.apply(
      {"params": p}, x, q, v, blocks_BxQ=q // BLOCK))
  for b in (first, n // BLOCK - 4):  # a block shared with the prompt; a late one
    lo, hi = b * BLOCK, (b + 1) * BLOCK
    view = jnp.concatenate([tokens[:, :lo], noisy[:, lo:hi]], axis=1)
    alone, _ = forward(params, view, pos[:, :hi], valid[:, :hi])
    np.testing.assert_allclose(np.asarray(both[:, lo:hi]),
                               np.asarray(alone[:, lo:hi]),
                               rtol=2e-4, atol=2e-4)


def test_loss_trains_experts_and_reports_loads(setup):
  _, config, rows, params = setup
  batch = rows_batch(rows, np.arange(4))
  (loss, metrics), grads = jax.jit(
      jax.value_and_grad(loss_fn, has_aux=True),
      static_argnames=("config", "block_length"))(
          params, batch, jax.random.key(1), config=config, block_length=BLOCK)
  assert np.isfinite(float(loss))
  loads = metrics["expert_load"]
  moe_layers = [f"layers_{i}" for i in range(config.n_layers)
                if config.is_moe_layer(i)]
  assert sorted(loads) == moe_layers
  t = 2 * np.prod(batch["tokens_BxN"].shape)  # the two copies
  for load in loads.values():
    assert float(load.sum()) == t * config.moe.top_k
  g = grads[moe_layers[0]]["moe"]
  assert float(jnp.abs(g["experts_up"]["kernel"]).sum()) > 0
  assert float(jnp.abs(g["expert_bias"]).sum()) == 0  # choice only


def test_balance_moves_biases_towards_the_mean():
  params = {"layers_1": {"moe": {"expert_bias": jnp.zeros(4)}, "x": 1},
            "head": 2}
  loads = {"layers_1": jnp.array([10.0, 2.0, 6.0, 2.0])}
  out = balance_experts(params, loads, 0.5)
  np.testing.assert_array_equal(out["layers_1"]["moe"]["expert_bias"],
                                [-0.5, 0.5, -0.5, 0.5])
  assert out["head"] == 2 and out["layers_1"]["x"] == 1
  assert float(params["layers_1"]["moe"]["expert_bias"].sum()) == 0
  assert float(expert_imbalance(loads)) == 10.0 / 5.0


def test_a_few_steps_lower_the_loss_and_balance(setup):
  _, config, rows, params = setup
  tc = TrainConfig(steps=12, batch_size=8, lr=3e-3, warmup_steps=2,
                   block_length=BLOCK, bias_rate=1e-2)
  optimizer = make_optimizer(tc)
  train_step, eval_step = make_steps(config, tc)
  state = TrainState(jnp.int32(0), params, optimizer.init(params))
  batch = rows_batch(rows, np.arange(8))
  before = eval_step(state.params, batch, jax.random.key(9))
  for _ in range(12):
    state, metrics = train_step(state, batch, jax.random.key(1))
  after = eval_step(state.params, batch, jax.random.key(9))
  assert float(after["loss"]) < 0.7 * float(before["loss"])
  assert "expert_imbalance" in metrics and "expert_load" not in metrics
  bias = state.params["layers_1"]["moe"]["expert_bias"]
  assert float(jnp.abs(bias).max()) > 0
  with pytest.raises(ValueError, match="block_length"):
    TrainConfig(block_length=0)
