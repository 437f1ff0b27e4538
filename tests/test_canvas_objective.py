"""DiffusionGemma's SFT objective (flash_dllm_train/canvas_objective.py).

Oracles: the canvas layout and the draws restated in Python; the training
forwards against the sampler's own sequence of calls (prefill the prompt,
append each clean canvas causally, denoise the noisy canvas against that
cache, then again with the self-conditioning signal of the first pass),
row by row; the loss restated in NumPy (float64) from those logits; a
few training steps that lower the loss, a training checkpoint that
restores, and a Google-format export that `load` reads and the
`diffusion-gemma` sampler decodes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.tokenizer_builder import build_tokenizer, corpus_texts
from flash_dllm_jax.architectures.diffusion_gemma import model as dg
from flash_dllm_jax.checkpoint import load, load_config
from flash_dllm_jax.generate import generate
from flash_dllm_train import checkpoints as ckpt, models
from flash_dllm_train.canvas_objective import (canvas_draws, canvas_layout,
                                               canvas_loss, canvas_passes)
from flash_dllm_train.config import TrainConfig, make_optimizer
from flash_dllm_train.data import encode_problems, rows_batch
from flash_dllm_train.train import TrainState, make_steps

SEQ, CANVAS = 160, 16


@pytest.fixture(scope="module")
def dg_setup():
  """A Gemma-id tokenizer, a tiny float32 DiffusionGemma (a local and a
  global layer, 4 experts top-2), rows of short problems, its init."""
  problems = [p for p in sg.generate(300, 0) if p["steps"] == 2]
  tok, ids = build_tokenizer(corpus_texts(problems), 320, "diffusion_gemma")
  config = models.train_config(
      "diffusion_gemma", ids, vocab_size=320, layers=2, d_model=32, heads=4,
      kv_heads=2, mlp_hidden=48, rope_theta=1e4, max_seq_len=256,
      dtype="float32", experts=4, top_k=2, expert_hidden=16,
      sliding_window=8, global_every=2)
  rows = encode_problems(problems, tok, SEQ)
  params = models.init_train_params(config, jax.random.key(0))
  return tok, config, rows, problems, params


def test_layout_and_draws_restated():
  end = 9
  tokens = np.full((3, 20), 1, np.int32)
  tokens[0, 7], tokens[1, 3], tokens[1, 12] = end, end, end
  prompt = np.arange(20)[None] < np.array([[4], [5], [6]])
  lp, count = canvas_layout(jnp.asarray(tokens), jnp.asarray(prompt), end, 4)
  # row 0: end at 7 -> canvases [4, 8); row 1: the end at 3 is in the
  # prompt, at 12 -> [5, 9), [9, 13); row 2: none -> all that fit (3).
  assert lp.tolist() == [4, 5, 6] and count.tolist() == [1, 2, 3]
  d = canvas_draws(jax.random.key(3), 3, 4000, jnp.array([1, 2, 3]), 50)
  t = np.asarray(d["t_B"])
  assert ((t >= 1e-4) & (t <= 1 - 1e-4)).all()
  kept = np.asarray(d["keep_BxC"]).mean(1)
  np.testing.assert_allclose(kept, 1 - t, atol=0.03)
  noise = np.asarray(d["noise_BxC"])
  assert noise.min() == 0 and noise.max() == 49
  assert (np.asarray(d["sel_B"]) < [1, 2, 3]).all()


@pytest.fixture(scope="module")
def passes(dg_setup):
  """Three rows of one prompt length, their draws (each row's last canvas,
  self-conditioning on rows 0 and 2), canvas_passes' outputs."""
  _, config, rows, _, params = dg_setup
  same = np.flatnonzero(rows.prompt_len_M == np.bincount(
      rows.prompt_len_M).argmax())[:3]
  batch = {k: jnp.asarray(v) for k, v in rows_batch(rows, same).items()}
  lp, count = canvas_layout(batch["tokens_BxN"], batch["prompt_BxN"],
                            config.end_of_turn_id, CANVAS)
  d = canvas_draws(jax.random.key(5), 3, CANVAS, count, config.n_text_ids)
  d = {**d, "sel_B": count - 1, "sc_B": jnp.array([True, False, True])}
  out = jax.jit(canvas_passes, static_argnums=(1, 6))(
      params, config, batch["tokens_BxN"], lp, count, d, CANVAS)
  return batch, lp, count, d, out


def test_passes_are_the_samplers_calls(dg_setup, passes):
  """Each row's training forwards equal the sampler's: causal prefill and
  appends into an empty cache, then the canvas denoised against it."""
  _, config, _, _, params = dg_setup
  batch, lp, count, d, out = passes
  assert len(set(lp.tolist())) == 1 and int(count.max()) >= 2
  fwd = jax.jit(dg.forward, static_argnums=(1,))
  for b in range(3):
    tokens = np.asarray(batch["tokens_BxN"][b])
    cache = dg.empty_cache(config, 1, SEQ, jnp.float32)
    pieces = [(0, int(lp[b]))] + [
        (int(lp[b]) + k * CANVAS, int(lp[b]) + (k + 1) * CANVAS)
        for k in range(int(count[b]) - 1)]
    enc = []
    for lo, hi in pieces:  # prefill, then each finished canvas appended
      slots = jnp.arange(lo, hi)[None]
      logits, cache = fwd(params, config, jnp.asarray(tokens[lo:hi])[None],
                          slots, cache, dg.causal(slots))
      enc.append(logits[0])
    used = pieces[-1][1]
    np.testing.assert_allclose(out["enc_logits"][b, :used],
                               jnp.concatenate(enc), atol=2e-4)
    slots = jnp.asarray(out["slots_BxC"][b])[None]
    assert int(slots[0, 0]) == used  # the last canvas, after the others
    xt = out["xt_BxC"][b][None]
    zeros = jnp.zeros((1, CANVAS, config.d_model))
    first, _ = fwd(params, config, xt, slots, cache, dg.canvas(slots), zeros)
    np.testing.assert_allclose(out["first"][b], first[0], atol=2e-4)
    sc = dg.encode_logits(params, config, first) if d["sc_B"][b] else zeros
    second, _ = fwd(params, config, xt, slots, cache, dg.canvas(slots), sc)
    np.testing.assert_allclose(out["logits"][b], second[0], atol=2e-4)
    keep = np.asarray(d["keep_BxC"][b])
    x0 = tokens[used:used + CANVAS]
    np.testing.assert_array_equal(out["xt_BxC"][b],
                                  np.where(keep, x0, d["noise_BxC"][b]))


def _ce(logits, targets):
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]


def test_loss_matches_numpy_restatement(passes):
  batch, lp, count, d, out = passes
  loss, metrics = canvas_loss(out, batch["tokens_BxN"], lp, d, CANVAS)
  tokens = np.asarray(batch["tokens_BxN"])
  total, dec = 0.0, 0.0
  for b in range(3):
    used = int(lp[b]) + int(count[b]) * CANVAS
    enc = _ce(out["enc_logits"][b, :used - 1], tokens[b, 1:used]).mean()
    canvas = _ce(out["logits"][b], out["x0_BxC"][b]).mean()
    total, dec = total + (canvas + enc) / 3, dec + canvas / 3
  np.testing.assert_allclose(float(loss), total, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["masked_ce"]), dec, rtol=1e-5)


def test_training_lowers_the_loss_resumes_and_exports(dg_setup, tmp_path):
  """train.py's jitted step on one batch lowers the loss; its training
  checkpoint (Google's format inside) restores what was saved and has the
  config resume compares; the bfloat16 export loads and decodes."""
  tok, config, rows, problems, params = dg_setup
  tc = TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup_steps=1,
                   block_length=CANVAS, eps=1e-4)
  train_step, _ = make_steps(config, tc)
  opt_state = make_optimizer(tc).init(params)
  state = TrainState(jnp.asarray(0, jnp.int32), params, opt_state)
  batch = {k: jnp.asarray(v) for k, v in rows_batch(rows, np.arange(4)).items()}
  losses, encoder = [], []  # the encoder's loss does not depend on draws
  for _ in range(8):
    state, metrics = train_step(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
    encoder.append(float(metrics["encoder_ce"]))
  assert encoder[-1] < encoder[0] - 0.5, encoder
  assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses
  path = ckpt.save_checkpoint(tmp_path, 8, state.params, state.opt_state,
                              config, tok)
  assert load_config(path / "model") == config
  step, got, got_opt, _, _ = ckpt.restore_checkpoint(path, opt_state)
  assert step == 8
  for a, b in zip(jax.tree.leaves((got, got_opt)),
                  jax.tree.leaves((state.params, state.opt_state))):
    np.testing.assert_array_equal(a, b)
  ckpt.export_model(tmp_path / "model", state.params, config, tok)
  model = load(tmp_path / "model")
  assert model[1] == config.replace(dtype="bfloat16")
  out = generate(model, [problems[0]["question"]], chat=True,
                 canvas_length=CANVAS, max_out_length=2 * CANVAS,
                 max_denoising_steps=3, forward="rows")
  ids = np.asarray(out.tokens_BxG[0])
  assert ids.shape == (2 * CANVAS,) and 1 <= out.steps_B[0] <= 6
  assert ((ids >= 0) & (ids < config.vocab_size)).all()
  end = np.isin(ids, config.stop_token_ids + (0,))
  assert out.texts[0] == tok.decode(ids[:np.argmax(end)] if end.any()
                                    else ids)
