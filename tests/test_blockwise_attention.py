"""Block-causal attention on the split kernel, decode block by decode block
(ops.blockwise_attention): the plain-JAX reference's values, and the same
bits for a query whether it runs in a whole-window forward or in a cached
forward of its block, over a longer cache, in any batch; the block families'
cached forwards and decodes then give the uncached ones' bits."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from flash_dllm_jax.generate import generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.strategies import build_sampler
from tests.test_sampling import random_prompts, tiny

L = 4  # decode block
# Key tiles of 16 slots, one tile a split: several splits at tiny shapes,
# merged by the combine kernel (group_target None) or in the kernel (1).
SPLIT = ops.Tiling(block_k=16, split_tiles=1)
KERNELS = ops.Kernels("pallas_interpret", attention=SPLIT)


def _mask(valid_BxS, l=L, rows=None):
  """The whole-window BlockCausal of left-padded rows (blocks counted from
  each row's first valid slot), queries = slots."""
  pos = jnp.maximum(jnp.cumsum(valid_BxS, axis=1) - 1, 0)
  rows_BxQ = jnp.where(valid_BxS, pos % l, -1)
  return ops.BlockCausal(valid_BxS, pos // l, pos // l, rows_BxQ, l), pos


def _qkv(b, s, seed=0, h=4, kh=2, d=16):
  ks = jax.random.split(jax.random.key(seed), 3)
  f = lambda k, n: jax.random.normal(k, (b, s, n, d), jnp.bfloat16)
  return f(ks[0], h), f(ks[1], kh), f(ks[2], kh)


@functools.partial(jax.jit, static_argnames=("impl",))
def _attend(q, k, v, mask, impl):
  return ops.attention(q, k, v, mask, scale=0.25, implementation=impl)


@pytest.mark.parametrize("tiling", [SPLIT, dataclasses.replace(
    SPLIT, group_target=1)], ids=["combine", "merged"])
def test_blockwise_matches_the_reference_and_a_cached_block(tiling):
  """Values of the masked reference; a block's queries over a longer cache
  (the cached step) give the whole-window rows' bits; row 0 alone too."""
  impl = ops.Kernels("pallas_interpret", attention=tiling)
  valid = jnp.asarray(np.arange(43)[None, :] >= np.array([[0], [7], [20]]))
  q, k, v = _qkv(3, 43)
  mask, pos = _mask(valid)
  got = _attend(q, k, v, mask, impl)
  want = ops.attention(q, k, v, dataclasses.replace(mask, block_length=None),
                       scale=0.25, implementation="reference")
  ok = np.asarray(valid)[:, :, None, None]
  np.testing.assert_allclose(np.where(ok, got, 0).astype(np.float32),
                             np.where(ok, want, 0).astype(np.float32),
                             atol=2e-2, rtol=2e-2)
  assert not np.asarray(got)[~np.asarray(valid)].any()  # padding: zeros
  # One block per row (slots 20..23 of row 0 = its block 5), cache of 70.
  pad = lambda x: jnp.pad(x, ((0, 0), (0, 27), (0, 0), (0, 0)))
  at = jnp.asarray([20, 28, 36])[:, None] + jnp.arange(L)
  take = lambda x: jnp.take_along_axis(x, at[:, :, None, None], axis=1)
  pos_q = jnp.take_along_axis(pos, at, axis=1)
  kb = jnp.pad(pos // L, ((0, 0), (0, 27)), constant_values=10 ** 6)
  block = ops.BlockCausal(jnp.pad(valid, ((0, 0), (0, 27))), kb, pos_q // L,
                          pos_q % L, L)
  cached = _attend(take(q), pad(k), pad(v), block, impl)
  np.testing.assert_array_equal(np.asarray(cached), np.asarray(take(got)))
  alone = _attend(q[:1], k[:1], v[:1], jax.tree.map(lambda x: x[:1], mask),
                  impl)
  np.testing.assert_array_equal(np.asarray(alone), np.asarray(got[:1]))


@jax.jit
def _step(params, tokens_BxN, valid_BxN, bc, start_B):
  config = _CONFIG[0]
  model = SequenceModel.for_batch(config, params, valid_BxN,
                                  implementation=KERNELS)
  active_B = jnp.ones(start_B.shape, bool)
  cached, bc = block_logits(model, tokens_BxN, bc, start_B, active_B, L)
  rows_BxL = start_B[:, None] + jnp.arange(L)
  return cached, model.logits(tokens_BxN, rows_BxL, block_length=L), bc


_CONFIG = []


def test_llada2_cached_block_logits_are_the_uncached_bits():
  """Window, pair and block forwards on the kernel path give the uncached
  forward's logits bit for bit."""
  config, params = tiny("llada2")
  _CONFIG[:] = [config]
  ids, valid = left_pad(random_prompts(4, [5, 22]), config.pad_token_id)
  b, p = np.shape(ids)
  n = p + 3 * L
  prompt = np.sum(valid, 1)
  start = (prompt // L) * L + p - prompt
  rng = np.random.default_rng(0)
  tokens = np.concatenate([ids, rng.integers(0, 300, (b, n - p))], 1)
  valid = np.concatenate([valid, np.ones((b, n - p), bool)], 1)
  model = SequenceModel.for_batch(config, params, jnp.asarray(valid))
  bc = BlockCache.empty(model)
  for step in range(3):  # window, then block, then pair (start moved)
    s = jnp.asarray(start + L * (step // 2))
    cached, uncached, bc = _step(params, jnp.asarray(tokens),
                                 jnp.asarray(valid), bc, s)
    np.testing.assert_array_equal(np.asarray(cached), np.asarray(uncached))


@pytest.mark.parametrize("arch,strategy", [("llada2", "llada2"),
                                           ("sdar", "sdar"),
                                           ("fast_dllm_v2", "fast-dllm-v2")])
def test_cached_decode_equals_the_uncached_on_the_kernel(arch, strategy):
  """Token ids of the cached decode = those of the whole-window loop, both
  on the block-by-block kernel path."""
  config, params = tiny(arch, eos_boost=1.2)
  sampler = build_sampler(strategy, arch, dict(gen_length=8, block_length=L))
  prompts = random_prompts(8, [5, 14])
  run = lambda s: generate(params, prompts, config=config, sampler=s,
                           kernels=KERNELS)
  cached = run(sampler)
  window = run(dataclasses.replace(sampler, block_cache=False))
  np.testing.assert_array_equal(cached.tokens_BxG, window.tokens_BxG)
  np.testing.assert_array_equal(cached.forwards_B, window.forwards_B)
