"""Elastic-Cache: exactness, batch invariance, arguments (the drift test is
in test_elastic_cache_drift.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.generate import generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.model import KVCache, Transformer, layerwise
from flash_dllm_jax.sampling import (DecodeState, ElasticCacheSampler,
                                     make_step, run_compiled, run_python)
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import answer_complete
from tests import test_sampling
from tests.test_sampling import random_prompts

SMALL = dict(gen_length=24, window=4, threshold=0.6)
tiny = functools.lru_cache(test_sampling.tiny)  # the tests never modify params


def test_layerwise_pieces_compose_to_the_transformer():
  config, params = tiny("dream")
  tokens = jnp.asarray(random_prompts(3, [10, 10]))
  pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
  valid = jnp.ones((2, 10), bool).at[0, :3].set(False)
  # XLA's default emitters (the suite's elemental ones round the two
  # programs apart in the last bit: tests/compile_level.py)
  emitters = {"xla_cpu_use_fusion_emitters": True}
  apply = jax.jit(Transformer(config).apply)
  args = ({"params": params}, tokens, pos, valid)
  want, _ = apply.lower(*args).compile(emitters)(*args)

  @jax.jit
  def composed(params):
    x = layerwise.embed(config, params, tokens)
    cache = KVCache.zeros(config, 2, 10)
    for l in range(config.n_layers):
      x, _, _ = layerwise.layer(config, params, l, x, pos, valid,
                                (cache.k[l], cache.v[l]), pos)
    return layerwise.head(config, params, x)

  got = composed.lower(params).compile(emitters)(params)
  np.testing.assert_array_equal(got, want)


def _reference_decode(config, params, prompt, gen, window, threshold):
  """Batch-1 restatement with a full uncached forward per step: decode the
  first `window` masks before the first stop token, conf >= threshold or
  the most confident one. Returns (generated ids, steps)."""
  model = Transformer(config)
  logits_fn = jax.jit(lambda x: model.apply(
      {"params": params}, x, jnp.arange(x.shape[1])[None],
      jnp.ones(x.shape, bool))[0])
  p, mask = len(prompt), config.mask_token_id
  x = np.array(prompt + [mask] * gen)
  steps = 0
  while True:
    stops = [i for i in range(p, p + gen) if x[i] in config.stop_token_ids]
    end = stops[0] if stops else p + gen
    masked = [i for i in range(p, end) if x[i] == mask]
    if not masked:
      break
    win = np.array(masked[:window])
    logits = np.asarray(logits_fn(jnp.asarray(x)[None]))[0, win, :]
    logits = logits - logits.max(-1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    conf, x0 = probs.max(-1), logits.argmax(-1)
    keep = conf >= threshold
    keep[np.argmax(conf)] = True
    x[win[keep]] = x0[keep]
    steps += 1
  gen_ids = x[p:]
  return np.where(gen_ids == mask, config.pad_token_id, gen_ids), steps


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_restart_at_layer_zero_every_step_equals_full_recomputation(arch):
  """refresh_every=1 runs every layer over the whole sequence through the
  layer-wise cache path each step: the same tokens as uncached forwards
  (recompute_all), which follow the windowed threshold rule restated."""
  config, params = tiny(arch, eos_boost=1.2)
  prompts = random_prompts(21, [5, 14, 9])
  full = generate(params, prompts, config=config,
                  sampler=ElasticCacheSampler(**SMALL, recompute_all=True))
  cached = generate(params, prompts, config=config,
                    sampler=ElasticCacheSampler(**SMALL, refresh_every=1))
  np.testing.assert_array_equal(cached.tokens_BxG, full.tokens_BxG)
  np.testing.assert_array_equal(cached.steps_B, full.steps_B)
  assert full.steps < 24  # the threshold commits several tokens per step
  if arch == "llada":
    for i, p in enumerate(prompts):
      want, steps = _reference_decode(config, params, p, 24, 4, 0.6)
      np.testing.assert_array_equal(full.tokens_BxG[i], want)
      assert full.steps_B[i] == steps


def test_whole_sequence_query_without_restarts_equals_full_recomputation():
  """A window over the whole generation and tracking every decoded token
  puts every position in each step's query: the query path alone (never
  restarting) must then reproduce uncached forwards."""
  config, params = tiny("llada")
  prompts = random_prompts(22, [5, 14])
  opts = dict(gen_length=16, window=16, track_num=64, threshold=0.6)
  full = generate(params, prompts, config=config, stop_at_eos=False,
                  sampler=ElasticCacheSampler(**opts, recompute_all=True))
  cached = generate(params, prompts, config=config, stop_at_eos=False,
                    sampler=ElasticCacheSampler(**opts, gamma=-1.0))
  np.testing.assert_array_equal(cached.tokens_BxG, full.tokens_BxG)


def test_never_restarting_terminates_and_rows_do_not_depend_on_the_batch():
  """gamma -1 never restarts. Every answer is complete and each row
  equals decoding it alone, and in another order between other prompts of
  its bucket (the batch's program). Rows restarting at different layers in
  one step are covered by the continuous-batching test (Dream)."""
  config, params = tiny("llada", eos_boost=1.2)
  sampler = ElasticCacheSampler(**SMALL, gamma=-1.0)
  prompts = random_prompts(23, [4, 13, 30])
  batch = generate(params, prompts, config=config, sampler=sampler)
  done = answer_complete(jnp.asarray(batch.tokens_BxG), config.mask_token_id,
                         config.stop_token_ids)
  assert bool(done.all()) and batch.steps <= sampler.num_steps
  others = random_prompts(24, [31, 2, 17])
  mixed = generate(params, [prompts[2], others[0], prompts[0]],
                   config=config, sampler=sampler)
  np.testing.assert_array_equal(mixed.tokens_BxG[[2, 0]], batch.tokens_BxG[::2])
  mixed = generate(params, [others[1], prompts[1], others[2]],
                   config=config, sampler=sampler)
  np.testing.assert_array_equal(mixed.tokens_BxG[1], batch.tokens_BxG[1])
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=sampler)
    np.testing.assert_array_equal(alone.tokens_BxG[0], batch.tokens_BxG[i])


def test_compiled_loop_equals_python_loop():
  config, params = tiny("llada")
  sampler = ElasticCacheSampler(**SMALL, gamma=0.97)
  ids, valid = left_pad(random_prompts(25, [5, 12, 8]), config.pad_token_id)
  p_len = ids.shape[1]
  valid_BxN = jnp.concatenate([jnp.asarray(valid), jnp.ones((3, 24), bool)], 1)
  model = SequenceModel.for_batch(config, params, valid_BxN,
                                  stop_ids=config.stop_token_ids)
  step_fn = make_step(sampler, model, p_len, config.stop_token_ids)
  keys_B = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
  state = DecodeState.start(jnp.asarray(ids), 24, config.mask_token_id, keys_B)
  state = state.replace(aux=sampler.init_aux(model, state.tokens_BxN))
  compiled = jax.jit(lambda s: run_compiled(step_fn, s, 24),
                     compiler_options=compiler_options())(state)
  python = run_python(step_fn, state, 24)
  for a, b in zip(jax.tree.leaves(compiled), jax.tree.leaves(python)):
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(compiled.step) > 1
  assert len(set(compiled.aux.full_layers_B.tolist())) > 1  # rows differ


def test_continuous_batching_equals_each_request_alone():
  """Dream, gamma 0.97 (rows restart at different layers): four requests
  through two slots; each answer equals decoding the request alone."""
  config, params = tiny("dream", eos_boost=1.2)
  sampler = ElasticCacheSampler(**SMALL, gamma=0.97)
  prompts = random_prompts(26, [4, 19, 9, 6])
  queued = generate(params, prompts, config=config, sampler=sampler,
                    batch_size=2)
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=sampler)
    np.testing.assert_array_equal(queued.tokens_BxG[i], alone.tokens_BxG[0])
    assert queued.steps_B[i] == alone.steps


@pytest.mark.parametrize("kwargs,message", [
    (dict(window=0), "window must be a positive int"),
    (dict(gen_length=8, window=16), r"window \(16\) must be <= gen_length"),
    (dict(track_num=0), "track_num must be a positive int"),
    (dict(gamma="high"), "gamma must be a real number"),  # NaN: test_sampler_options
    (dict(threshold=0.0), "threshold must be in"),
    (dict(rule="fixed", steps=8), r"steps \(8\) commits up to 32 tokens a "
     r"step, more than window \(16\)"),
    (dict(rule="fixed", steps=0), "steps must be None or a positive int"),
    (dict(steps=64), "steps \\(64\\) applies to rule='fixed' only"),
    (dict(rule="factor"), "rule must be one of"),
    (dict(refresh_every=0), "refresh_every must be None or a positive int"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match="invalid ElasticCacheSampler arguments: "
                     + message):
    ElasticCacheSampler(**kwargs)


def test_fixed_rule_commits_a_fixed_number_per_step():
  config, params = tiny("llada")
  sampler = ElasticCacheSampler(gen_length=24, window=4, rule="fixed",
                                steps=8)
  out = generate(params, random_prompts(28, [5, 9]), config=config,
                 sampler=sampler, stop_at_eos=False)
  assert out.steps == 8 and (out.forwards_B == 8).all()
  assert not (out.tokens_BxG == config.mask_token_id).any()
