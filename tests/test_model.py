"""The forward over arbitrary positions, the KV cache and its donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import KVCache, Transformer, init_params


def setup(arch, b=2, n=24, dtype="float32", seed=0):
  config = ModelConfig.tiny(arch, dtype=dtype)
  params = init_params(config, jax.random.key(seed), param_dtype=jnp.float32)
  tokens = jax.random.randint(jax.random.key(seed + 1), (b, n), 0, 370)
  pos = jnp.broadcast_to(jnp.arange(n), (b, n))
  return config, params, tokens, pos


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_cached_forward_equals_full_forward(arch):
  config, params, tokens, pos = setup(arch)
  model = Transformer(config)
  b, n = tokens.shape
  valid = jnp.ones((b, n), bool)
  apply = jax.jit(model.apply)
  full, _ = apply({"params": params}, tokens, pos, valid)

  # Prefill a longer cache with every position, then recompute a scattered
  # subset against it: those rows' logits equal the full forward's.
  s = n + 8
  cache = KVCache.zeros(config, b, s, jnp.float32)
  key_valid = jnp.arange(s)[None, :] < n
  prefill, cache = apply({"params": params}, tokens, pos,
                         jnp.broadcast_to(key_valid, (b, s)), cache=cache,
                         slots_BxQ=pos)
  np.testing.assert_allclose(prefill, full, rtol=1e-5, atol=1e-5)
  subset_BxQ = jnp.array([[3, 17, 0, 9], [22, 1, 5, 5]])
  sub_tokens = jnp.take_along_axis(tokens, subset_BxQ, axis=1)
  logits, _ = apply({"params": params}, sub_tokens, subset_BxQ,
                    jnp.broadcast_to(key_valid, (b, s)), cache=cache,
                    slots_BxQ=subset_BxQ)
  want = jnp.take_along_axis(full, subset_BxQ[..., None], axis=1)
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)


def test_logit_rows_select_rows_of_the_full_output():
  config, params, tokens, pos = setup("dream")
  apply = jax.jit(Transformer(config).apply)
  valid = jnp.ones(tokens.shape, bool)
  full, _ = apply({"params": params}, tokens, pos, valid)
  rows = jnp.array([[0, 5, 23], [7, 7, 2]])
  some, _ = apply({"params": params}, tokens, pos, valid, logit_rows_BxR=rows)
  np.testing.assert_allclose(some, jnp.take_along_axis(full, rows[..., None], 1),
                             rtol=1e-6, atol=1e-6)


def test_cache_write_skips_negative_slots_and_keeps_other_rows():
  config = ModelConfig.tiny("llada")
  cache = KVCache.zeros(config, 2, 10, jnp.float32)
  cache = jax.tree.map(lambda x: jax.random.normal(jax.random.key(0), x.shape),
                       cache)
  new = jnp.ones((2, 3, config.n_kv_heads, config.head_dim))
  slots = jnp.array([[1, -1, 4], [-1, -1, 9]])
  out = cache.write(0, new, 2 * new, slots)
  k0, k1 = np.asarray(cache.k[0]), np.asarray(out.k[0])
  assert (k1[0, 1] == 1).all() and (k1[0, 4] == 1).all() and (k1[1, 9] == 1).all()
  assert (np.asarray(out.v[0])[1, 9] == 2).all()
  untouched = np.ones((2, 10), bool)
  untouched[0, [1, 4]] = untouched[1, 9] = False
  np.testing.assert_array_equal(k1[untouched], k0[untouched])
  np.testing.assert_array_equal(np.asarray(out.k[1]), np.asarray(cache.k[1]))


def test_donated_cache_is_updated_in_place():
  config, params, tokens, pos = setup("llada")
  model = Transformer(config)
  b, n = tokens.shape
  cache = KVCache.zeros(config, b, n, jnp.float32)

  def step(params, cache, tokens):
    return model.apply({"params": params}, tokens, pos, jnp.ones((b, n), bool),
                       cache=cache, slots_BxQ=pos)

  jitted = jax.jit(step, donate_argnums=1)
  hlo = jitted.lower(params, cache, tokens).compile().as_text()
  # every layer's K and V buffer is aliased to an output
  assert hlo.count("may-alias") + hlo.count("must-alias") >= 2 * config.n_layers
  _, new_cache = jitted(params, cache, tokens)
  assert all(x.is_deleted() for x in jax.tree.leaves(cache))
  assert not any(x.is_deleted() for x in jax.tree.leaves(new_cache))


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_rows_without_valid_keys_stay_finite(arch):
  config, params, tokens, pos = setup(arch)
  valid = jnp.ones(tokens.shape, bool).at[1].set(False)
  logits, _ = jax.jit(Transformer(config).apply)({"params": params}, tokens,
                                                 pos, valid)
  assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_bfloat16_compute_tracks_float32(arch):
  config, params, tokens, pos = setup(arch)
  valid = jnp.ones(tokens.shape, bool)
  f32, _ = jax.jit(Transformer(config).apply)({"params": params}, tokens, pos,
                                              valid)
  bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  bf16, _ = jax.jit(Transformer(config.replace(dtype="bfloat16")).apply)(
      {"params": bf16_params}, tokens, pos, valid)
  assert bf16.dtype == jnp.float32  # logits are always float32
  err = np.linalg.norm(np.asarray(bf16 - f32)) / np.linalg.norm(np.asarray(f32))
  assert err < 3e-2


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_sequence_model_cached_matches_uncached_under_left_padding(arch):
  from flash_dllm_jax.sampling.sequence_model import SequenceModel
  config, params, tokens, _ = setup(arch, b=3, n=20)
  valid = jnp.arange(20)[None, :] >= jnp.array([[0], [5], [11]])
  model = SequenceModel.for_batch(config, params, valid)
  rows = jnp.broadcast_to(jnp.arange(12, 20), (3, 8))
  want = jax.jit(model.logits)(tokens, rows)
  cached = jax.jit(model.cached)
  slots = jnp.broadcast_to(jnp.arange(20), (3, 20))
  _, cache = cached(tokens, slots, model.empty_cache(jnp.float32))
  # Re-run only rows 12..19 (and one padding query) against the filled cache.
  sub = jnp.concatenate([rows, jnp.full((3, 1), -1)], axis=1)
  got, _ = cached(jnp.take_along_axis(tokens, jnp.maximum(sub, 0), 1), sub,
                  cache, rows_BxR=jnp.broadcast_to(jnp.arange(8), (3, 8)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_cached_forward_through_the_kernels_matches_the_reference(
    arch, monkeypatch):
  """The model's cached path with the Pallas kernels (interpreted on CPU)
  equals the plain-JAX path; the kernels must really run (no fallback)."""
  from flash_dllm_jax.sampling.sequence_model import SequenceModel
  from pallas_kernels.attention import reference as attention_ref
  from pallas_kernels.cache_update import reference as cache_ref
  config = ModelConfig.tiny(arch, head_dim=64)
  params = init_params(config, jax.random.key(3), param_dtype=jnp.float32)
  b, n = 2, 40
  tokens = jax.random.randint(jax.random.key(4), (b, n), 0, 370)
  valid = jnp.arange(n)[None, :] >= jnp.array([[0], [9]])
  slots = jnp.broadcast_to(jnp.arange(n), (b, n))
  sub = jnp.array([[33, 2, 17, -1], [39, 12, 9, 30]])
  sub_tokens = jnp.take_along_axis(tokens, jnp.maximum(sub, 0), 1)

  def run(impl):
    model = SequenceModel.for_batch(config, params, valid, implementation=impl)
    cached = jax.jit(model.cached)
    _, cache = cached(tokens, slots, model.empty_cache(jnp.float32))
    return cached(sub_tokens, sub, cache)

  want_logits, want_cache = run("reference")
  def no_fallback(*args, **kwargs):
    raise AssertionError("the kernel path fell back to the reference")
  monkeypatch.setattr(attention_ref, "scheduled_attention", no_fallback)
  monkeypatch.setattr(cache_ref, "rope_write", no_fallback)
  got_logits, got_cache = run("pallas_interpret")
  np.testing.assert_allclose(got_logits, want_logits, rtol=1e-4, atol=1e-4)
  for got, want in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
