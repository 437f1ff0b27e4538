"""The exact cache of finished blocks (sampling/block_cache.py) and the
block strategies built on it: cached forwards give the uncached forward's
bits, cached decodes the uncached tokens and model calls; llada2-flash's
verify pass against an uncached forward; loop = Python loop, batch
invariance and continuous = static for llada2 and llada2-flash."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import generate
from flash_dllm_jax.model import init_params
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.block_flash import LLaDA2FlashSampler
from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.row_sampling import GREEDY, Sampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from tests.test_sampling import (check_compiled_equals_python,
                                 check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 random_prompts, tiny)
from tests.row_sampling_case import replay_logprobs

BL, GEN = 4, 8


@functools.lru_cache(maxsize=None)
def _model(dtype):
  config = ModelConfig.tiny("llada2", dtype=dtype)
  return config, init_params(config, jax.random.key(2), head_init_scale=8.0)


@functools.partial(jax.jit, static_argnums=(0,),
                   compiler_options=compiler_options())  # as decodes are
def _step(config, params, tokens_BxN, valid_BxN, bc, start_B):
  """The cached and the uncached logits of the rows' blocks at start_B."""
  model = SequenceModel.for_batch(config, params, valid_BxN)
  active_B = jnp.ones(start_B.shape, bool)
  cached, bc = block_logits(model, tokens_BxN, bc, start_B, active_B, BL)
  rows_BxL = start_B[:, None] + jnp.arange(BL)
  return cached, model.logits(tokens_BxN, rows_BxL, block_length=BL), bc


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_block_logits_are_the_uncached_bits(dtype):
  """Window, pair and block forwards, rows of a batch in different ones,
  give the uncached full-window forward's logits bit for bit."""
  config, params = _model(dtype)
  ids, valid = left_pad(random_prompts(4, [5, 9]), config.pad_token_id)
  b, p = np.shape(ids)
  n = p + GEN + BL - 1
  prompt = np.sum(valid, 1)
  start = (prompt // BL) * BL + p - prompt
  rng = np.random.default_rng(0)
  fills = np.full((4, b, n), -1, np.int32)
  for r in range(b):  # step 1: two of the block's masks committed
    fills[1, r, start[r] + rng.choice(BL, 2, replace=False)] = (
        rng.integers(0, 300, 2))
  fills[2, 0, start[0]:start[0] + BL] = rng.integers(0, 300, BL)  # finished
  fills[2, 1, start[1] + 3] = 7
  fills[3, 0, start[0] + BL + 1] = 11
  fills[3, 1, start[1]:start[1] + BL] = rng.integers(0, 300, BL)
  tokens = np.concatenate([ids, np.full((b, n - p), config.mask_token_id)],
                          axis=1).astype(np.int32)
  valid = jnp.asarray(np.concatenate([valid, np.ones((b, n - p), bool)], 1))
  model = SequenceModel.for_batch(config, params, valid)
  bc = BlockCache.empty(model)
  for s in range(4):  # both fresh; both in their block; row 0 past a
    # finished block, row 1 in its block; row 0 in its block, row 1 fresh
    tokens = np.where(fills[s] >= 0, fills[s], tokens)
    if s == 2:
      start[0] += BL
    if s == 3:
      bc = bc.reset_rows(jnp.array([False, True]))
    cached, uncached, bc = _step(config, params, jnp.asarray(tokens), valid,
                                 bc, jnp.asarray(start, jnp.int32))
    np.testing.assert_array_equal(np.asarray(cached), np.asarray(uncached),
                                  err_msg=f"step {s}")
    assert np.asarray(bc.final_B).tolist() == start.tolist()


def test_verify_probabilities_are_the_uncached_mask_views():
  """One layer: mask row i's keys are the embedded tokens it sees, so its
  probability of draft i is the uncached forward's at candidate i on the
  canvas holding the drafts before i (and masks from i on)."""
  config = ModelConfig.tiny("llada2", n_layers=1)
  params = init_params(config, jax.random.key(5), head_init_scale=8.0)
  sampler = LLaDA2FlashSampler(gen_length=GEN, block_length=BL)
  ids, valid = left_pad(random_prompts(6, [6, 3]), config.pad_token_id)
  b, p = np.shape(ids)
  n = p + GEN + BL - 1
  tokens = np.concatenate([ids, np.full((b, n - p), config.mask_token_id)],
                          axis=1).astype(np.int32)
  prompt = np.sum(valid, 1)
  start = (prompt // BL) * BL + p - prompt + BL  # the second block
  tokens[:, p:] = np.where(np.arange(p, n) < start[:, None], 17 + np.arange(
      p, n) % 50, config.mask_token_id)  # earlier blocks decoded
  tokens[0, start[0] + 1] = 99  # one committed in row 0's block
  valid = jnp.asarray(np.concatenate([valid, np.ones((b, n - p), bool)], 1))

  @functools.partial(jax.jit, compiler_options=compiler_options())
  def run(tokens_BxN, start_B):
    model = SequenceModel.for_batch(config, params, valid)
    bc = BlockCache.empty(model)
    logits, bc = block_logits(model, tokens_BxN, bc, start_B,
                              jnp.ones((b,), bool), BL)
    x0_BxL = jnp.argmax(logits, -1).astype(tokens_BxN.dtype)
    conf_BxL = jax.nn.softmax(logits, -1).max(-1)
    pos_BxL = start_B[:, None] + jnp.arange(BL)
    masked_BxL = jnp.take_along_axis(tokens_BxN, pos_BxL, 1) == (
        config.mask_token_id)
    return sampler.verify_block(model, tokens_BxN, bc.cache, pos_BxL,
                                start_B, x0_BxL, conf_BxL, masked_BxL)

  v = run(jnp.asarray(tokens), jnp.asarray(start, jnp.int32))
  p_BxC, slots_BxC, drafts_BxC = (np.asarray(a) for a in (
      v.p_BxC, v.slots_BxC, v.drafts_BxC))
  assert (slots_BxC >= 0).sum(1).tolist() == [BL // 2, BL // 2]
  model = SequenceModel.for_batch(config, params, valid)
  uncached = jax.jit(model.logits, static_argnames="block_length")
  for r in range(b):
    canvas = tokens.copy()
    for i, (slot, draft) in enumerate(zip(slots_BxC[r], drafts_BxC[r])):
      logits = uncached(jnp.asarray(canvas), jnp.full((b, 1), slot),
                        block_length=BL)[r, 0]
      want = jax.nn.softmax(logits)[draft]
      np.testing.assert_allclose(p_BxC[r, i], want, rtol=1e-5, atol=1e-7)
      canvas[r, slot] = draft


# Decodes -----------------------------------------------------------------------
LLADA2 = LLaDA2Sampler(gen_length=16, block_length=BL, steps=4, threshold=0.7)
FLASH = LLaDA2FlashSampler(gen_length=16, block_length=BL, threshold=0.7,
                           gamma=0.5)
FLASH_FACTOR = LLaDA2FlashSampler(gen_length=16, block_length=BL,
                                  rule="factor", factor=1.5, gamma=0.5,
                                  eos_early_stop=True)


@pytest.mark.parametrize("sampler", [LLADA2, FLASH, FLASH_FACTOR],
                         ids=["llada2", "flash", "flash-factor"])
def test_cached_decode_equals_the_uncached_loop(sampler):
  """Tokens, model calls and steps of every row as when each step re-runs
  the whole window."""
  config, params = tiny("llada2", eos_boost=1.2)
  prompts = random_prompts(8, [5, 14, 9])
  cached = generate(params, prompts, config=config, sampler=sampler)
  window = generate(params, prompts, config=config,
                    sampler=dataclasses.replace(sampler, block_cache=False))
  np.testing.assert_array_equal(cached.tokens_BxG, window.tokens_BxG)
  np.testing.assert_array_equal(cached.forwards_B, window.forwards_B)
  np.testing.assert_array_equal(cached.steps_B, window.steps_B)
  assert not (cached.tokens_BxG == config.mask_token_id).any()
  if isinstance(sampler, LLaDA2FlashSampler):  # verify passes ran
    assert (cached.forwards_B > cached.steps_B).any()


def test_flash_compiled_loop_equals_the_python_loop():
  check_compiled_equals_python("llada2", FLASH_FACTOR, 1.2, 22, [5, 12, 8])


def test_flash_rows_do_not_depend_on_the_batch():
  """Three prompts: the batch shape of the cached decode test above, whose
  program runs."""
  check_rows_do_not_depend_on_the_batch("llada2", FLASH, 1.2, 23, [4, 13, 30])


@pytest.mark.parametrize("sampler", [LLADA2, FLASH], ids=["llada2", "flash"])
def test_continuous_batching_equals_each_request_alone(sampler):
  """Four requests through two slots in one compiled loop (a refilled slot
  runs its window again): every answer, model call count and step count
  equals decoding that request alone."""
  check_continuous_equals_alone("llada2", sampler, 1.2, [4, 19, 9, 6])


def test_llada2_flash_rows_sample_on_their_own():
  """llada2-flash drafts per row (Flash-dLLM's row_sampling): a sampled
  row, a greedy row and a row with its own threshold in one batch each
  equal the row alone (the greedy row under the greedy sampler, the
  threshold row under the sampler built with that threshold); with gamma 1
  (no verified commits) logprobs equal a replay of the commit steps."""
  config, params = tiny("llada2", eos_boost=1.5)
  model = (params, config, None)
  prompts, seeds = random_prompts(6, [5, 12, 9]), [3, 4, 5]
  base = LLaDA2FlashSampler(gen_length=GEN, block_length=BL, gamma=1.0)
  rows = [Sampling(2.0, 0.95, 20), GREEDY, Sampling(threshold=0.6)]
  got = generate(model, prompts, sampler=base, seed=seeds, sampling=rows,
                 logprobs=True)
  for i, (s, own) in enumerate([
      (rows[0], base), (None, base),
      (None, dataclasses.replace(base, threshold=0.6))]):
    alone = generate(model, [prompts[i]], sampler=own, seed=seeds[i],
                     sampling=s, logprobs=True)
    np.testing.assert_array_equal(got.tokens_BxG[i], alone.tokens_BxG[0])
    np.testing.assert_array_equal(got.logprobs_BxG[i], alone.logprobs_BxG[0])
  greedy = generate(model, prompts[:1], sampler=base, seed=seeds[0],
                    logprobs=True)
  assert (got.tokens_BxG[0] != greedy.tokens_BxG[0]).any()
  want = replay_logprobs(model, base, prompts, seeds, rows,
                         lambda seq, t: seq.logits(t, jnp.broadcast_to(
                             jnp.arange(t.shape[1]), t.shape), block_length=BL))
  np.testing.assert_allclose(got.logprobs_BxG, want, atol=2e-5)
