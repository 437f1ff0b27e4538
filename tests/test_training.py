"""Masked-diffusion training: the objective, training rows, a few steps.

Oracles: a NumPy restatement of LLaDA's loss (float64) from the same draws;
invariance of the loss to anything at invalid positions; the loss on a fixed
batch before and after a few steps (the runs — checkpoints, resuming, time
fitting, data parallelism, the script — are in test_training_runs.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.model import Transformer, init_params
from flash_dllm_train.data import Batches, rows_batch
from flash_dllm_train.objective import (diffusion_draws, loss_fn,
                                        masked_diffusion_loss, noise_tokens)
from flash_dllm_train.config import TrainConfig, make_optimizer
from flash_dllm_train.train import make_steps
from tests.training_setup import setup  # noqa: F401 (a fixture)

SEQ = 48


def _toy_batch(config, b=3, n=SEQ, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config.vocab_size - 8, (b, n)).astype(np.int32)
  prompt = np.arange(n)[None] < np.array([5, 12, 20])[:b, None]
  valid = np.arange(n)[None] < np.array([n, n - 7, 30])[:b, None]
  return {"tokens_BxN": tokens, "prompt_BxN": prompt, "valid_BxN": valid}


def _numpy_loss(logits, tokens, prompt, valid, t, u):
  """LLaDA's SFT loss, restated: mask response tokens with u < t, sum CE/t
  over them, divide by the response length, average rows."""
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  total = 0.0
  for b in range(tokens.shape[0]):
    response = valid[b] & ~prompt[b]
    masked = response & (u[b] < t[b])
    ce = [-logp[b, i, tokens[b, i]] for i in np.flatnonzero(masked)]
    total += sum(c / t[b] for c in ce) / max(response.sum(), 1)
  return total / tokens.shape[0]


def test_loss_matches_numpy_restatement(setup):
  _, config, _, _ = setup
  params = init_params(config, jax.random.key(0))
  batch = _toy_batch(config)
  rng = jax.random.key(3)
  loss, metrics = jax.jit(loss_fn, static_argnames="config")(
      params, batch, rng, config=config)
  t, u = map(np.asarray, diffusion_draws(rng, 3, SEQ))
  assert np.all((t >= 1e-3) & (t <= 1.0))
  response = batch["valid_BxN"] & ~batch["prompt_BxN"]
  noisy, masked = map(np.asarray, noise_tokens(
      jnp.asarray(batch["tokens_BxN"]), jnp.asarray(response), jnp.asarray(t),
      jnp.asarray(u), config.mask_token_id))
  assert np.all(noisy[masked] == config.mask_token_id)
  assert np.all(noisy[~masked] == batch["tokens_BxN"][~masked])
  positions = np.maximum(np.cumsum(batch["valid_BxN"], -1) - 1, 0)
  logits, _ = jax.jit(Transformer(config).apply)(
      {"params": params}, noisy, positions, batch["valid_BxN"])
  want = _numpy_loss(logits, batch["tokens_BxN"], batch["prompt_BxN"],
                     batch["valid_BxN"], t, u)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert metrics["mask_frac"] > 0


def test_loss_on_hand_picked_masks():
  """Two rows, fixed t and masks, logits whose CE is known by hand."""
  v = 4
  logits = np.zeros((2, 3, v), np.float32)       # uniform: CE = log 4
  logits[1, 2] = [0, 0, np.log(3.0), 0]           # p(token 2) = 3/6
  tokens = np.array([[1, 2, 3], [0, 1, 2]])
  masked = np.array([[False, True, True], [False, False, True]])
  response = np.array([[False, True, True], [True, True, True]])
  t = np.array([0.5, 0.25], np.float32)
  loss, m = masked_diffusion_loss(jnp.asarray(logits), jnp.asarray(tokens),
                                  jnp.asarray(masked), jnp.asarray(response),
                                  jnp.asarray(t))
  row0 = 2 * np.log(4) / 0.5 / 2
  row1 = np.log(2) / 0.25 / 3
  np.testing.assert_allclose(float(loss), (row0 + row1) / 2, rtol=1e-6)
  np.testing.assert_allclose(float(m["masked_ce"]),
                             (2 * np.log(4) + np.log(2)) / 3, rtol=1e-6)
  assert float(m["mask_frac"]) == pytest.approx(3 / 5)


def test_prompt_and_padding_never_masked_or_counted(setup):
  _, config, _, _ = setup
  batch = _toy_batch(config)
  response = batch["valid_BxN"] & ~batch["prompt_BxN"]
  for seed in range(20):
    t, u = diffusion_draws(jax.random.key(seed), 3, SEQ)
    _, masked = noise_tokens(jnp.asarray(batch["tokens_BxN"]),
                             jnp.asarray(response), t, u, 0)
    assert not np.any(np.asarray(masked) & ~response)
  _, all_masked = noise_tokens(jnp.asarray(batch["tokens_BxN"]),
                               jnp.asarray(response), jnp.ones(3),
                               jnp.zeros((3, SEQ)), 0)
  assert np.array_equal(np.asarray(all_masked), response)
  # Whatever sits at invalid positions changes nothing.
  params = init_params(config, jax.random.key(1))
  other = dict(batch, tokens_BxN=np.where(batch["valid_BxN"],
                                          batch["tokens_BxN"], 7))
  f = jax.jit(loss_fn, static_argnames="config")
  a = f(params, batch, jax.random.key(5), config=config)[0]
  b = f(params, other, jax.random.key(5), config=config)[0]
  np.testing.assert_allclose(float(a), float(b), rtol=1e-6)


def test_training_rows(setup):
  tok, config, rows, problems = setup
  assert rows.dropped == 0 and rows.tokens_MxN.shape == (len(problems), 128)
  row, p = rows.tokens_MxN[0], int(rows.prompt_len_M[0])
  prompt = tok.apply_chat_template(
      [{"role": "user", "content": problems[0]["question"]}])
  assert tok.decode(row[:p], skip_special_tokens=False) == prompt
  end = int(rows.min_len_M[0])
  assert tok.decode(row[p:end - 2]) == problems[0]["answer"]
  assert row[end - 2] == config.eot_token_id
  assert np.all(row[end - 1:] == config.eos_token_id)
  batches = Batches(rows, 8, seed=0)
  b0 = batches(0)
  assert all(np.array_equal(b0[k], Batches(rows, 8, seed=0)(0)[k]) for k in b0)
  lengths = b0["valid_BxN"].sum(-1)
  assert np.all(lengths >= rows.min_len_M[batches.indices(0)])
  epoch = np.concatenate([batches.indices(s) for s in range(len(problems)
                                                            // 8)])
  assert len(set(epoch.tolist())) == len(epoch)  # a permutation per epoch
  full = Batches(rows, 8, seed=0, eos_pad="full")(0)
  assert full["valid_BxN"].all()
  with pytest.raises(ValueError, match="eos_pad"):
    Batches(rows, 8, eos_pad="none")


def test_a_few_steps_lower_the_loss(setup):
  _, config, rows, _ = setup
  tc = TrainConfig(steps=30, batch_size=8, lr=3e-3, warmup_steps=2)
  optimizer = make_optimizer(tc)
  train_step, eval_step = make_steps(config, tc)
  params = init_params(config, jax.random.key(0), param_dtype="float32")
  from flash_dllm_train.train import TrainState
  state = TrainState(jnp.int32(0), params, optimizer.init(params))
  batch = rows_batch(rows, np.arange(8))
  before = float(eval_step(state.params, batch, jax.random.key(9))["loss"])
  for _ in range(30):
    state, _ = train_step(state, batch, jax.random.key(1))
  after = float(eval_step(state.params, batch, jax.random.key(9))["loss"])
  assert int(state.step) == 30
  assert after < 0.7 * before, (before, after)


def test_implementation_is_checked_and_reaches_the_model(setup):
  with pytest.raises(ValueError, match="implementation='cudnn'"):
    TrainConfig(implementation="cudnn")
  _, config, rows, _ = setup
  batch = rows_batch(rows, np.arange(4))
  params = init_params(config, jax.random.key(0), param_dtype="float32")
  loss = jax.jit(loss_fn, static_argnames=("config", "implementation"))
  losses = [float(loss(params, batch, jax.random.key(1), config=config,
                       implementation=impl)[0])
            for impl in (None, "reference", "pallas_interpret")]
  assert losses[0] == losses[1] == losses[2]  # off GPU: all the reference
