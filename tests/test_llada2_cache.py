"""The exact cache of finished blocks (sampling/block_cache.py) and the
block strategies built on it: cached forwards give the uncached forward's
bits, cached decodes the uncached tokens and model calls; llada2-flash's
verify pass against an uncached forward; loop = Python loop, batch
invariance and continuous = static for llada2 and llada2-flash."""

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
from flash_dllm_jax.sampling import LLaDA2FlashSampler, LLaDA2Sampler
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from tests.test_sampling import (check_compiled_equals_python,
                                 check_rows_do_not_depend_on_the_batch,
                                 random_prompts, tiny)

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
