"""Long prompts: a block-causal pass attends a chunk of queries at a time
and runs its routed experts a chunk of tokens at a time, bit for bit as in
one piece, so the compiled decode's buffers grow linearly with the prompt
(no [B, Q, S] mask, no float32 scores over every query and key)."""

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import decode_jit
from flash_dllm_jax.model import init_params, moe
from flash_dllm_jax.strategies import build_sampler

ATTENTION = importlib.import_module("flash_dllm_jax.ops.attention")
CONFIG = ModelConfig.tiny("llada2", max_seq_len=4096)
QUERY_CHUNK = 64  # the query chunk the memory test compiles with


def test_block_causal_query_chunks_keep_every_bit():
  """40 queries over 40 keys (blocks of 8, a padded key) in chunks of 16
  (the last padded) equal one piece bit for bit (both compiled: XLA:CPU's
  eager and tiny products may take other paths)."""
  b, n, h, k, d = 2, 40, 4, 2, 16
  q, kk, v = (jax.random.normal(jax.random.key(i), (b, n, x, d))
              for i, x in ((0, h), (1, k), (2, k)))
  valid = jnp.ones((b, n), bool).at[1, 0].set(False)
  blocks = jnp.broadcast_to(jnp.arange(n) // 8, (b, n))
  mask = ops.BlockCausal(valid, blocks, blocks)
  run = lambda chunk: jax.jit(lambda *a: ops.attention(
      *a, mask, scale=0.25, query_chunk=chunk))(q, kk, v)
  whole, chunked = run(None), run(16)
  np.testing.assert_array_equal(np.asarray(chunked), np.asarray(whole))
  assert not np.array_equal(np.asarray(whole[:, :8]),
                            np.asarray(ops.attention(q, kk, v, valid,
                                                     scale=0.25)[:, :8]))


def test_routed_experts_token_chunks_keep_every_bit():
  """The MoE layer's routed sum over 1024 tokens in chunks of 256 equals
  one piece bit for bit, and so does 1000 of them in chunks of 256 (the
  last padded). XLA:CPU's dense experts keep a row's bits from 256 rows
  on, in multiples of 256 (below, or at 1000 rows, another product path)."""
  cfg, t = CONFIG, 1024
  params = init_params(cfg, jax.random.key(3))["layers_1"]["moe"]
  x = jax.random.normal(jax.random.key(4), (t, cfg.d_model))
  ids = jax.random.randint(jax.random.key(5), (t, cfg.moe.top_k), 0,
                           cfg.moe.n_experts)
  w = jax.random.uniform(jax.random.key(6), (t, cfg.moe.top_k))
  stacks = tuple((params[n]["kernel"],) for n in
                 ("experts_gate", "experts_up", "experts_down"))
  run = lambda chunk, t: np.asarray(jax.jit(lambda *a: moe.routed_sum(
      *a, stacks, token_chunk=chunk))(x[:t], ids[:t], w[:t]))
  whole = run(None, t)
  np.testing.assert_array_equal(run(256, t), whole)
  np.testing.assert_array_equal(run(256, 1000), whole[:1000])


@functools.cache
def _temp_bytes(prompt: int) -> int:
  """XLA's temporary bytes of the compiled llada2 decode of one row
  (abstract inputs: nothing runs), at QUERY_CHUNK."""
  sampler = build_sampler("llada2", "llada2", dict(
      gen_length=32, block_length=16, threshold=None, steps=2))
  params = jax.eval_shape(lambda: init_params(CONFIG, jax.random.key(0)))
  spec = jax.ShapeDtypeStruct
  rng = jax.eval_shape(lambda: jax.random.key(0)[None])
  chunk, ATTENTION.QUERY_CHUNK = ATTENTION.QUERY_CHUNK, QUERY_CHUNK
  try:
    compiled = decode_jit.lower(
        params, spec((1, prompt), jnp.int32), spec((1, prompt), bool), rng,
        None, config=CONFIG, sampler=sampler, stop_at_eos=False).compile()
  finally:
    ATTENTION.QUERY_CHUNK = chunk
  return compiled.memory_analysis().temp_size_in_bytes


def test_long_prompt_decode_memory_grows_linearly():
  """The llada2 decode's temporary bytes at prompts 512 and 1024 stay
  under N x (6 copies of one query chunk's float32 scores per key; the
  CPU's reference attention materialises a chunk's scores), a bound linear
  in the positions N and below one layer's float32 scores over every
  query and key (H x N x N x 4), which the whole-prompt pass held."""
  h = CONFIG.n_heads
  for prompt in (512, 1024):
    n = prompt + 32 + 15  # prompt + gen + the last block's tail
    bound = n * 6 * h * QUERY_CHUNK * 4
    assert bound < h * n * n * 4
    assert 0 < _temp_bytes(prompt) <= bound, (prompt, _temp_bytes(prompt),
                                             bound)


@pytest.mark.gpu
def test_long_prompt_tokens_on_the_gpu():
  """On a GPU, bf16, a small random LLaDA2 (head dim 64, cuDNN's attention)
  with prompts past QUERY_CHUNK (their prefill in query chunks): the block
  cache's tokens are the whole-window decode's, and a row's tokens alone
  are its tokens among 3 rows of other lengths."""
  from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
  from flash_dllm_jax.generate import generate
  config = ModelConfig.tiny("llada2", dtype="bfloat16", head_dim=64,
                            max_seq_len=4096)
  params = init_params(config, jax.random.key(2), head_init_scale=8.0)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 370, n).tolist() for n in (1500, 1100, 1900)]
  sampler = LLaDA2Sampler(gen_length=32, block_length=16, steps=4,
                          threshold=None)
  cached = generate(params, prompts, config=config, sampler=sampler)
  window = generate(params, prompts, config=config,
                    sampler=dataclasses.replace(sampler, block_cache=False))
  np.testing.assert_array_equal(cached.tokens_BxG, window.tokens_BxG)
  alone = generate(params, prompts[:1], config=config, sampler=sampler)
  np.testing.assert_array_equal(alone.tokens_BxG[0], cached.tokens_BxG[0])
