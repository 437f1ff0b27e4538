"""A row left-padded by more whole prompt buckets decodes to the same bits.

The attention sums keys tile by tile from key 0 and adds the tile sums in
key order (pallas_kernels/attention/reference.py), so masked tiles in front
add exact zeros, and RoPE positions count from the first real token. The
server's one slot pool relies on it: every prompt is padded to the pool's
length there, and to its own bucket offline. bfloat16 with sharp logits,
where a changed order of the key sums flips near-tied tokens.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import decode_jit
from flash_dllm_jax.model.transformer import init_params
from flash_dllm_jax.prompts import PROMPT_BUCKET, left_pad
from flash_dllm_jax.model import CachedExtras
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.strategies import build_sampler
from pallas_kernels.attention import reference
from tests.test_sampling import random_prompts

# Two buckets more: the model-level tests stay quick; the attention test
# pads past the ~1000 keys from which XLA:CPU's own softmax sum changed
# order with the padding.
EXTRA = 2 * PROMPT_BUCKET
LENGTHS = [5, 33, 64]


def _model(arch):
  config = ModelConfig.tiny(arch, dtype="bfloat16")
  return config, init_params(config, jax.random.key(7), head_init_scale=8.0)


def _layouts(config, extra=EXTRA):
  """(ids, valid) of LENGTHS padded to their bucket, and `extra` more."""
  ids, valid = left_pad(random_prompts(3, LENGTHS), config.pad_token_id)
  assert ids.shape[1] == PROMPT_BUCKET
  pad = lambda x, v: np.concatenate(
      [np.full((x.shape[0], extra), v, x.dtype), x], axis=1)
  return (ids, valid), (pad(ids, config.pad_token_id), pad(valid, False))


@pytest.mark.parametrize("arch,strategy,options", [
    ("llada", "llada", {"gen_length": 16, "steps": 16, "block_length": 8}),
    ("llada", "flash-dllm", {"gen_length": 24, "block_m": 4, "track_num": 2,
                             "mask_num": 2, "threshold": 0.9, "gamma": 0.4}),
    ("dream", "elastic-cache", {"gen_length": 16}),
    ("llada2", "llada2-flash", {"gen_length": 16, "block_length": 4,
                                "threshold": 0.7, "gamma": 0.5}),
])
def test_a_decode_does_not_depend_on_whole_bucket_padding(arch, strategy,
                                                          options):
  """Token ids, forwards and steps of every row, uncached (LLaDA's sampler),
  cached with attention mass and verify passes (Flash-dLLM, Elastic-Cache),
  and block-causal with a block cache (LLaDA2)."""
  config, params = _model(arch)
  sampler = build_sampler(strategy, arch, options)
  rng_B = jax.vmap(jax.random.key)(jnp.arange(len(LENGTHS), dtype=jnp.uint32))
  outs = [decode_jit(params, jnp.asarray(ids), jnp.asarray(valid), rng_B,
                     config=config, sampler=sampler)
          for ids, valid in _layouts(config)]
  for got, want in zip(outs[1], outs[0]):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("arch", ["llada", "dream", "llada2"])
def test_forwards_and_attention_mass_do_not_depend_on_it(arch):
  """Logits of the uncached forward (block-causal for LLaDA2), of a cached
  prefill and a cached pass with its attention mass, bit for bit."""
  config, params = _model(arch)
  g, block = 16, (4 if arch == "llada2" else None)

  @jax.jit
  def forwards(params, ids, valid):
    b, p = ids.shape
    tokens = jnp.concatenate(
        [ids, jnp.full((b, g), config.mask_token_id, jnp.int32)], axis=1)
    model = SequenceModel.for_batch(
        config, params, jnp.concatenate([valid, jnp.ones((b, g), bool)], 1))
    rows = jnp.broadcast_to(jnp.arange(p, p + g), (b, g))
    uncached = model.logits(tokens, rows, block)
    slots = jnp.broadcast_to(jnp.arange(p + g), (b, p + g))
    if block:
      cached, _ = model.block_cached(tokens, slots, model.empty_cache(),
                                     rows, block)
      return uncached, cached
    _, cache = model.cached(tokens, slots, model.empty_cache())
    out = model.run(tokens[:, p:], slots[:, p:], cache,
                    jnp.broadcast_to(jnp.arange(g), (b, g)),
                    extras=CachedExtras(mass_rows_BxQ=jnp.ones((b, g), bool)))
    return uncached, out.logits, out.mass_BxS[:, -(PROMPT_BUCKET + g):]

  results = [forwards(params, jnp.asarray(ids), jnp.asarray(valid))
             for ids, valid in _layouts(config)]
  for got, want in zip(results[1], results[0]):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
def test_attention_does_not_depend_on_it(dtype):
  """Both plain-JAX attentions (uncached; over a cache with in-query keys
  and the mass per key) at 160 keys and with 64, 960 and 1984 masked keys
  in front: XLA's own softmax sum changed bits from 960 on."""
  rng = np.random.default_rng(0)
  b, q, h, kh, d, s, t = 3, 40, 4, 2, 16, 160, 5
  x = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  q_, k, v, k_new, v_new = (x(b, q, h, d), x(b, s, kh, d), x(b, s, kh, d),
                            x(b, t, kh, d), x(b, t, kh, d))
  valid = np.zeros((b, s), bool)
  valid[:, [20, 60, 90]] = True
  valid[:, 96:] = True
  inq = jnp.asarray(rng.random((b, q, t)) < 0.5)

  def attend(k, v, valid):
    o = reference.masked_attention(q_, k, v, valid, scale=0.25)
    o2, mass = reference.scheduled_attention(
        q_, k, v, jnp.full((b,), k.shape[1]), jnp.full((b,), q), scale=0.25,
        exclude_BxS=~valid, score_rows_BxQ=jnp.ones((b, q), bool),
        k_new_BxIxKxD=k_new, v_new_BxIxKxD=v_new, inq_mask_BxQxI=inq)
    return o, o2, mass[:, -s:]

  want = jax.jit(attend)(k, v, jnp.asarray(valid))
  for extra in (64, 960, 1984):
    pad = lambda a, fill: jnp.concatenate(
        [jnp.full((b, extra) + a.shape[2:], fill, a.dtype), a], axis=1)
    got = jax.jit(attend)(pad(k, 3), pad(v, -2), pad(jnp.asarray(valid),
                                                      False))
    for g, w in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w),
                                    err_msg=f"{extra} keys in front")
