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
from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.generate import generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.strategies import build_sampler
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params
from tests.test_sampling import random_prompts

L = 4  # decode block
# Key tiles of 16 slots, one tile a split: several splits at tiny shapes.
# group_target 24: a whole-window call (many programs) merges its splits in
# the kernel, a cached block's call runs them in separate programs merged by
# the combine kernel; both must give the same bits.
SPLIT = ops.Tiling(block_k=16, split_tiles=1, group_target=24)
# The experts' dense path (a row's bits at any row count) around it; the
# block-by-block path is opt-in (block_attention="split").
KERNELS = ops.Kernels("pallas_interpret", attention=SPLIT, experts=None,
                      block_attention="split")


@functools.cache  # shared by the tests (never mutated)
def _one_layer(arch):
  """A tiny random model of one layer (a MoE one for llada2), sharp logits:
  the attention under test at the least compile time."""
  config = ModelConfig.tiny(arch).replace(n_layers=1)
  if config.moe is not None:
    config = config.replace(moe=dataclasses.replace(config.moe,
                                                    first_dense_layers=0))
  return config, init_params(config, jax.random.key(7), head_init_scale=8.0)


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


@functools.partial(jax.jit, static_argnames=("impl",),
                   compiler_options=compiler_options())
def _attend(q, k, v, mask, impl):
  return ops.attention(q, k, v, mask, scale=0.25, implementation=impl)


def test_blockwise_matches_the_reference_and_a_cached_block():
  """Values of the masked reference; a block's queries over a longer cache
  (the cached step), in a smaller batch, give the whole-window rows'
  bits."""
  impl = KERNELS
  valid = jnp.asarray(np.arange(27)[None, :] >= np.array([[0], [5], [13]]))
  q, k, v = _qkv(3, 27)
  mask, pos = _mask(valid)
  got = _attend(q, k, v, mask, impl)
  want = ops.attention(q, k, v, dataclasses.replace(mask, block_length=None),
                       scale=0.25, implementation="reference")
  ok = np.asarray(valid)[:, :, None, None]
  np.testing.assert_allclose(np.where(ok, got, 0).astype(np.float32),
                             np.where(ok, want, 0).astype(np.float32),
                             atol=2e-2, rtol=2e-2)
  assert not np.asarray(got)[~np.asarray(valid)].any()  # padding: zeros
  # Rows 0 and 1 over a cache of 48: row 0's block 3 (slots 12..15), row
  # 1's positions 9..12 (slots 14..17: the end of block 2, block 3's start).
  two = lambda x: x[:2]
  pad = lambda x: jnp.pad(two(x), ((0, 0), (0, 21)) + ((0, 0),) * (x.ndim - 2))
  at = jnp.asarray([12, 14])[:, None] + jnp.arange(L)
  take = lambda x: jnp.take_along_axis(two(x), at[:, :, None, None], axis=1)
  pos_q = jnp.take_along_axis(two(pos), at, axis=1)
  kb = jnp.pad(two(pos) // L, ((0, 0), (0, 21)), constant_values=10 ** 6)
  block = ops.BlockCausal(pad(valid), kb, pos_q // L, pos_q % L, L)
  cached = _attend(take(q), pad(k), pad(v), block, impl)
  np.testing.assert_array_equal(np.asarray(cached), np.asarray(take(got)))


def test_the_default_kernels_split_on_a_gpu_only():
  """Kernels() (block_attention unset) sends a BlockCausal with its block
  length to the split kernel on a GPU ('pallas') and to the reference's
  masked path under 'pallas_interpret' (no Pallas call); "fused" to JAX's
  fused attention on a GPU, "split" to the kernel on both. A bad choice
  is refused."""
  valid = jnp.asarray(np.arange(12)[None, :] >= np.array([[0], [3]]))
  q, k, v = _qkv(2, 12)
  mask, _ = _mask(valid)
  calls = lambda impl: str(jax.make_jaxpr(lambda *a: ops.attention(
      *a, scale=0.25, implementation=impl))(q, k, v, mask)).count(
          "pallas_call")
  assert calls(ops.Kernels("pallas")) > 0
  assert calls(ops.Kernels("pallas_interpret")) == 0
  for name in ("pallas", "pallas_interpret"):
    assert calls(ops.Kernels(name, block_attention="fused")) == 0, name
    assert calls(ops.Kernels(name, block_attention="split")) > 0, name
  # The model: Kernels() traces the program a kernel name alone does.
  config, params = _one_layer("llada2")
  valid = jnp.ones((2, 12), bool)

  def jaxpr(impl):
    model = SequenceModel.for_batch(config, params, valid,
                                    implementation=impl)
    return str(jax.make_jaxpr(lambda t: model.logits(
        t, jnp.arange(4)[None].repeat(2, 0), block_length=L))(
            jnp.ones((2, 12), jnp.int32)))
  split = jaxpr(ops.Kernels("pallas"))
  assert split == jaxpr("pallas")
  assert split == jaxpr(ops.Kernels("pallas", block_attention="split"))
  fused = jaxpr(ops.Kernels("pallas", block_attention="fused"))
  assert split.count("pallas_call") > fused.count("pallas_call")
  with pytest.raises(ValueError, match="block_attention"):
    ops.Kernels(block_attention="blocks")


@functools.partial(jax.jit, static_argnums=(0,),
                   compiler_options=compiler_options())  # as decodes are
def _step(config, params, tokens_BxN, valid_BxN, bc, start_B):
  """The cached and the uncached logits of the rows' blocks at start_B
  (read one row earlier: the token shift)."""
  model = SequenceModel.for_batch(config, params, valid_BxN,
                                  implementation=KERNELS)
  active_B = jnp.ones(start_B.shape, bool)
  cached, bc = block_logits(model, tokens_BxN, bc, start_B, active_B, L,
                            shift=1)
  rows_BxL = start_B[:, None] - 1 + jnp.arange(L)
  return cached, model.logits(tokens_BxN, rows_BxL, block_length=L), bc


def test_shifted_cached_block_logits_are_the_uncached_bits():
  """Fast-dLLM v2's window, pair and block forwards (one slot more: the
  token shift, queries of two blocks) on the kernel path give the uncached
  forward's logits bit for bit."""
  config, params = _one_layer("fast_dllm_v2")
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
    cached, uncached, bc = _step(config, params, jnp.asarray(tokens),
                                 jnp.asarray(valid), bc, s)
    np.testing.assert_array_equal(np.asarray(cached), np.asarray(uncached),
                                  err_msg=f"step {step}")


def test_llada2_cached_decode_equals_the_uncached_on_the_kernel():
  """Token ids and model calls of llada2's cached decode = those of its
  whole-window loop, both on the block-by-block kernel path."""
  config, params = _one_layer("llada2")
  sampler = build_sampler("llada2", "llada2",
                          dict(gen_length=8, block_length=L))
  prompts = random_prompts(8, [5, 14])
  run = lambda s: generate(params, prompts, config=config, sampler=s,
                           kernels=KERNELS)
  cached = run(sampler)
  window = run(dataclasses.replace(sampler, block_cache=False))
  np.testing.assert_array_equal(cached.tokens_BxG, window.tokens_BxG)
  np.testing.assert_array_equal(cached.forwards_B, window.forwards_B)


@pytest.mark.gpu
def test_llada2_cached_forwards_are_the_uncached_bits_on_the_gpu():
  """On a GPU (Kernels(), block attention split: the Triton kernel, the
  automatic split), bf16, LLaDA2.0-mini's
  attention shapes (16 heads over 4 KV heads of 128), block 32, prompts of
  8k and 5k slots: window, block and pair forwards give the uncached
  forward's logits bit for bit, at batch 2 and for row 0 alone."""
  bl = 32
  config = ModelConfig.tiny("llada2", dtype="bfloat16", n_heads=16,
                            n_kv_heads=4, head_dim=128, max_seq_len=8448)
  params = init_params(config, jax.random.key(2), head_init_scale=8.0)

  @functools.partial(jax.jit, compiler_options=compiler_options())
  def step(tokens_BxN, valid_BxN, bc, start_B):
    model = SequenceModel.for_batch(
        config, params, valid_BxN,
        implementation=ops.Kernels())
    active_B = jnp.ones(start_B.shape, bool)
    cached, bc = block_logits(model, tokens_BxN, bc, start_B, active_B, bl)
    rows_BxL = start_B[:, None] + jnp.arange(bl)
    return cached, model.logits(tokens_BxN, rows_BxL, block_length=bl), bc

  def run(prompts):
    ids, valid = left_pad(prompts, config.pad_token_id)
    b, p = np.shape(ids)
    n = p + 3 * bl
    prompt = np.sum(valid, 1)
    start = (prompt // bl) * bl + p - prompt
    tokens = np.concatenate([ids, np.full((b, n - p), 7)], 1)
    valid = np.concatenate([valid, np.ones((b, n - p), bool)], 1)
    bc = BlockCache.empty(SequenceModel.for_batch(config, params,
                                                  jnp.asarray(valid)))
    out = []
    for k in range(3):  # window, block, pair
      cached, uncached, bc = step(jnp.asarray(tokens), jnp.asarray(valid), bc,
                                  jnp.asarray(start + bl * (k // 2)))
      np.testing.assert_array_equal(np.asarray(cached), np.asarray(uncached),
                                    err_msg=f"forward {k}")
      out.append(np.asarray(cached))
    return out

  prompts = random_prompts(3, [8000, 5000])
  both, alone = run(prompts), run(prompts[:1])
  for k in range(3):
    np.testing.assert_array_equal(alone[k][0], both[k][0])
