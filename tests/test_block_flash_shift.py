"""llada2-flash on a family whose logits row i predicts position i + 1
(Fast-dLLM v2, config.logits_shift 1): the shifted cached block forwards
give the uncached rows' bits, the verify pass's predictor rows the uncached
mask views, gamma 1 commits what the threshold rule restated over the
uncached forward commits, cached = uncached loop, batch invariance and
continuous batching = each request alone."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import generate
from flash_dllm_jax.model import init_params
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.block_flash import LLaDA2FlashSampler
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from tests.test_sampling import (check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 random_prompts, tiny)

ARCH, BL, GEN = "fast_dllm_v2", 4, 16
FLASH = LLaDA2FlashSampler(gen_length=GEN, block_length=BL, threshold=0.7,
                           gamma=0.5)


def _canvas(config, lengths, seed):
  """(tokens, valid, p, n): left-padded prompts then masks."""
  ids, valid = left_pad(random_prompts(seed, lengths), config.pad_token_id)
  b, p = np.shape(ids)
  n = p + GEN + BL - 1
  tokens = np.concatenate([ids, np.full((b, n - p), config.mask_token_id)],
                          axis=1).astype(np.int32)
  valid = np.concatenate([valid, np.ones((b, n - p), bool)], 1)
  return tokens, jnp.asarray(valid), p, n


def test_shifted_block_logits_are_the_uncached_rows_bits():
  """Window, pair and block forwards (rows of a batch in different ones)
  give the uncached forward's rows start - 1 ... start + L - 2 bit for
  bit: the block's first position reads the previous block's last row."""
  config, params = tiny(ARCH)
  tokens, valid, p, n = _canvas(config, [5, 8], 0)
  start = (np.asarray(valid[:, :p]).sum(1) // BL) * BL + p - np.asarray(
      valid[:, :p]).sum(1)

  @functools.partial(jax.jit, compiler_options=compiler_options())
  def step(tokens_BxN, bc, start_B):
    model = SequenceModel.for_batch(config, params, valid)
    cached, bc = block_logits(model, tokens_BxN, bc, start_B,
                              jnp.ones(start_B.shape, bool), BL, shift=1)
    rows_BxL = jnp.maximum(start_B[:, None] - 1 + jnp.arange(BL), 0)
    return cached, model.logits(tokens_BxN, rows_BxL, block_length=BL), bc

  rng = np.random.default_rng(1)
  bc = BlockCache.empty(SequenceModel.for_batch(config, params, valid))
  for s in range(4):  # both fresh; both in their block; row 0 past a
    # finished block, row 1 in its block; row 0 in its block, row 1 fresh
    if s == 1:
      tokens[0, start[0] + 2] = 9
      tokens[1, start[1] + 3] = 11
    if s == 2:
      tokens[0, start[0]:start[0] + BL] = rng.integers(0, 300, BL)
      start[0] += BL
    if s == 3:
      tokens[0, start[0] + 1] = 13
      bc = bc.reset_rows(jnp.array([False, True]))
    cached, uncached, bc = step(jnp.asarray(tokens), bc,
                                jnp.asarray(start, jnp.int32))
    np.testing.assert_array_equal(np.asarray(cached), np.asarray(uncached),
                                  err_msg=f"step {s}")


def test_verify_probabilities_are_the_uncached_shifted_mask_views():
  """One layer: candidate i's probability is the uncached forward's row
  before its slot on the canvas holding the drafts before i (masks from i
  on); the block's first position included (its row is the previous
  block's last)."""
  config = ModelConfig.tiny(ARCH, n_layers=1)
  params = init_params(config, jax.random.key(5), head_init_scale=8.0)
  tokens, valid, p, n = _canvas(config, [6, 3], 6)
  prompt = np.asarray(valid[:, :p]).sum(1)
  start = (prompt // BL) * BL + p - prompt + BL  # the second block
  tokens[:, p:] = np.where(np.arange(p, n) < start[:, None], 17 + np.arange(
      p, n) % 50, config.mask_token_id)  # earlier blocks decoded
  tokens[0, start[0] + 3] = 99  # one committed in row 0's block

  @functools.partial(jax.jit, compiler_options=compiler_options())
  def run(tokens_BxN, start_B):
    model = SequenceModel.for_batch(config, params, valid)
    logits, bc = block_logits(model, tokens_BxN, BlockCache.empty(model),
                              start_B, jnp.ones(start_B.shape, bool), BL, 1)
    pos_BxL = start_B[:, None] + jnp.arange(BL)
    masked_BxL = jnp.take_along_axis(tokens_BxN, pos_BxL, 1) == (
        config.mask_token_id)
    # Candidates: positions 0 then 1 (1's predictor is draft row 0), and
    # 1 then 0 (1's predictor holds a later candidate's mask); position 0
    # reads the previous block's last row.
    conf_BxL = jnp.array([[0.5, 0.4, 0.2, 0.1], [0.4, 0.5, 0.2, 0.1]])
    x0_BxL = jnp.argmax(logits, -1).astype(tokens_BxN.dtype)
    return FLASH.verify_block(model, tokens_BxN, bc.cache, pos_BxL, start_B,
                              x0_BxL, conf_BxL, masked_BxL)

  v = run(jnp.asarray(tokens), jnp.asarray(start, jnp.int32))
  p_BxC, slots_BxC, drafts_BxC = (np.asarray(a) for a in (
      v.p_BxC, v.slots_BxC, v.drafts_BxC))
  assert (slots_BxC >= 0).sum(1).tolist() == [BL // 2, BL // 2]
  assert slots_BxC.tolist() == [[start[0], start[0] + 1],
                                 [start[1] + 1, start[1]]]
  model = SequenceModel.for_batch(config, params, valid)
  uncached = jax.jit(model.logits, static_argnames="block_length")
  for r in range(2):
    canvas = tokens.copy()
    for i, (slot, draft) in enumerate(zip(slots_BxC[r], drafts_BxC[r])):
      logits = uncached(jnp.asarray(canvas), jnp.full((2, 1), slot - 1),
                        block_length=BL)[r, 0]
      want = jax.nn.softmax(logits)[draft]
      np.testing.assert_allclose(p_BxC[r, i], want, rtol=1e-5, atol=1e-7)
      canvas[r, slot] = draft


def _restated(config, params, prompt, threshold):
  """(answer, steps) of llada2-flash with gamma 1 for one prompt, restated
  over the uncached forward: block by block from the prompt's, each step
  drafts the argmax of row j - 1 for block position j and commits the
  masks with confidence >= threshold and the most confident one; the
  answer ends after a block holding EOS, or after the last block."""
  p, mask, eos = len(prompt), config.mask_token_id, config.eos_token_id
  x = np.array(prompt + [mask] * (GEN + BL - 1), np.int32)
  model = SequenceModel.for_batch(config, params, jnp.ones((1, len(x)), bool))
  uncached = jax.jit(model.logits, static_argnames="block_length")
  block, steps = p // BL, 0
  while block < -(-(p + GEN) // BL):
    s = block * BL
    while (x[s:s + BL] == mask).any():
      logits = uncached(jnp.asarray(x[None]), jnp.arange(s - 1, s + BL - 1)[
          None], block_length=BL)[0]
      probs = np.asarray(jax.nn.softmax(logits, -1))
      x0, conf = probs.argmax(-1), probs.max(-1)
      masked = x[s:s + BL] == mask
      commit = masked & (conf >= threshold)
      commit[np.argmax(np.where(masked, conf, -1.0))] = True
      x[s:s + BL] = np.where(commit, x0, x[s:s + BL])
      steps += 1
    if (x[p:s + BL] == eos).any():
      break
    block += 1
  return x[p:p + GEN], steps


def test_gamma_one_is_the_restated_rule_and_cached_is_uncached():
  """Rows with gamma 1 (a verify pass accepts nothing) give the restated
  threshold rule's tokens (to the first EOS) and steps; rows with gamma
  0.5 accept verified drafts and take fewer steps. The uncached loop
  (block_cache off) gives every row's tokens, model calls and steps."""
  config, params = tiny(ARCH, eos_boost=1.2)
  prompts = random_prompts(8, [5, 14, 8, 12])
  rows = [Sampling(gamma=g) for g in (1.0, 0.5) for _ in prompts]
  model = (params, config, None)
  out = generate(model, prompts * 2, sampler=FLASH, sampling=rows)
  window = generate(model, prompts * 2, sampling=rows,
                    sampler=dataclasses.replace(FLASH, block_cache=False))
  np.testing.assert_array_equal(out.tokens_BxG, window.tokens_BxG)
  np.testing.assert_array_equal(out.forwards_B, window.forwards_B)
  np.testing.assert_array_equal(out.steps_B, window.steps_B)
  n, ended = len(prompts), 0
  for i, prompt in enumerate(prompts):
    want, steps = _restated(config, params, prompt, FLASH.threshold)
    hit = np.flatnonzero(want == config.eos_token_id)
    end = hit[0] + 1 if len(hit) else GEN
    assert out.tokens_BxG[i][:end].tolist() == want[:end].tolist(), i
    assert out.steps_B[i] == steps, i
    ended += bool(len(hit))
  assert 0 < ended < n  # answers ending at EOS, and not
  assert (out.forwards_B[:n] > out.steps_B[:n]).any()  # verify ran
  assert out.steps_B[n:].sum() < out.steps_B[:n].sum()


def test_rows_do_not_depend_on_the_batch():
  check_rows_do_not_depend_on_the_batch(ARCH, FLASH, 1.2, 23, [4, 13, 30])


def test_continuous_batching_equals_each_request_alone():
  """Four requests through two slots (a refilled slot runs its window
  again): every answer, model call count and step count equals that
  request alone."""
  check_continuous_equals_alone(ARCH, FLASH, 1.2, [4, 19, 9, 6])
