"""Elastic-Cache: exactness, batch invariance, the drift test, arguments."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import generate, left_pad
from flash_dllm_jax.model import KVCache, Transformer, init_params, layerwise
from flash_dllm_jax.sampling import (DecodeState, ElasticCacheSampler,
                                     make_step, run_compiled, run_python)
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import advance, answer_complete
from tests import test_sampling
from tests.independent_forward import _rms, _rope
from tests.test_sampling import random_prompts

SMALL = dict(gen_length=24, window=4, threshold=0.6)
tiny = functools.lru_cache(test_sampling.tiny)  # the tests never modify params


def test_layerwise_pieces_compose_to_the_transformer():
  config, params = tiny("dream")
  tokens = jnp.asarray(random_prompts(3, [10, 10]))
  pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
  valid = jnp.ones((2, 10), bool).at[0, :3].set(False)
  want, _ = jax.jit(Transformer(config).apply)({"params": params}, tokens,
                                                pos, valid)

  @jax.jit
  def composed(params):
    x = layerwise.embed(config, params, tokens)
    cache = KVCache.zeros(config, 2, 10)
    for l in range(config.n_layers):
      x, _, _ = layerwise.layer(config, params, l, x, pos, valid,
                                (cache.k[l], cache.v[l]), pos)
    return layerwise.head(config, params, x)

  np.testing.assert_array_equal(composed(params), want)


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
  equals decoding it alone, and in another order between other prompts
  (with more left padding). Rows restarting at different layers in one step
  are covered by the continuous-batching test (Dream)."""
  config, params = tiny("llada", eos_boost=1.2)
  sampler = ElasticCacheSampler(**SMALL, gamma=-1.0)
  prompts = random_prompts(23, [4, 13, 30])
  batch = generate(params, prompts, config=config, sampler=sampler)
  done = answer_complete(jnp.asarray(batch.tokens_BxG), config.mask_token_id,
                         config.stop_token_ids)
  assert bool(done.all()) and batch.steps <= sampler.num_steps
  mixed = generate(params, random_prompts(24, [40]) + prompts[::-1],
                   config=config, sampler=sampler)
  np.testing.assert_array_equal(mixed.tokens_BxG[1:][::-1], batch.tokens_BxG)
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
  compiled = jax.jit(lambda s: run_compiled(step_fn, s, 24))(state)
  python = run_python(jax.jit(step_fn), state, 24)
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


# The drift test -----------------------------------------------------------
@functools.partial(jax.jit, static_argnums=1)
def _layer0_probs(params, config, tokens_BxN, pos_BxN, valid_BxN, rows_BxT):
  """Layer 0's attention [B, T, H, N] of rows over all positions, from
  scratch: its input is the embedding, so it depends on the tokens alone."""
  p, c = params["layers_0"], config
  b, n = tokens_BxN.shape
  h = _rms(params["embed"][tokens_BxN], p["attn_norm"]["scale"],
           c.rms_norm_eps)
  q = (h @ p["q_proj"]["kernel"]).reshape(b, n, c.n_heads, c.head_dim)
  k = (h @ p["k_proj"]["kernel"]).reshape(b, n, c.n_kv_heads, c.head_dim)
  q, k = _rope(q, pos_BxN, c.rope_theta), _rope(k, pos_BxN, c.rope_theta)
  k = jnp.repeat(k, c.n_heads // c.n_kv_heads, axis=2)
  q = jnp.take_along_axis(q, jnp.maximum(rows_BxT, 0)[:, :, None, None], 1)
  s = jnp.einsum("bthd,bshd->bths", q, k) / np.sqrt(c.head_dim)
  s = jnp.where(valid_BxN[:, None, None, :], s, -jnp.inf)
  return jax.nn.softmax(s, -1)


def _cosine_mean(a, b, rows_BxT, valid_BxN):
  """Per row: cosine similarity over heads, mean over rows and valid keys."""
  out = []
  for i in range(a.shape[0]):
    t, s = rows_BxT[i] >= 0, valid_BxN[i]
    x, y = a[i][t][:, :, s], b[i][t][:, :, s]  # [T, H, S]
    norms = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    cos = (x * y).sum(1) / norms
    out.append(cos.mean())
  return np.array(out)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _recompute_from(config, r, params, x_1xNxE, positions_1xN, valid_1xN):
  """(inputs, keys) of layers r.. for one row, every position recomputed
  from x_1xNxE, the input of layer r."""
  n = x_1xNxE.shape[1]
  kv = KVCache.zeros(config, 1, n)
  inputs, keys = [], []
  for l in range(r, config.n_layers):
    inputs.append(x_1xNxE)
    x_1xNxE, (k, _), _ = layerwise.layer(
        config, params, l, x_1xNxE, positions_1xN, valid_1xN,
        (kv.k[l], kv.v[l]), jnp.arange(n)[None])
    keys.append(k)
  return inputs, keys


def test_drift_test_restarts_where_the_reference_would():
  """Mid-decode, on one fixed state: the layer-0 similarity matches a
  from-scratch computation; for each gamma the row restarts after the first
  layer whose similarity is below it; and from the restart layer on, the
  whole sequence is recomputed from the stored hidden states while the
  layers below keep their stale rows."""
  config = ModelConfig.tiny("llada", n_layers=3)
  params = init_params(config, jax.random.key(7), head_init_scale=8.0)
  L, gen = config.n_layers, 16
  ids, valid = left_pad(random_prompts(27, [6, 13]), config.pad_token_id)
  p_len = ids.shape[1]
  valid_BxN = jnp.concatenate([jnp.asarray(valid), jnp.ones((2, gen), bool)], 1)
  model = SequenceModel.for_batch(config, params, valid_BxN)
  sampler = lambda gamma: ElasticCacheSampler(gen_length=gen, window=4,
                                              threshold=0.95, gamma=gamma)
  never = sampler(-1.0)

  @jax.jit
  def never_step(st):
    tr = never.step_trace(model, st, p_len)
    return tr, advance(st, tr.tokens_BxN, tr.aux, tr.forwards_B, p_len,
                       config.mask_token_id, (), st.rng_B)

  keys_B = jax.vmap(jax.random.key)(jnp.arange(2, dtype=jnp.uint32))
  state = DecodeState.start(jnp.asarray(ids), gen, config.mask_token_id, keys_B)
  state = state.replace(aux=never.init_aux(model, state.tokens_BxN))
  for _ in range(3):
    prev = state
    state = never_step(state)[1]
  base = never_step(state)[0]
  sims = np.asarray(base.similarity_BxL)
  assert np.isfinite(sims).all() and (np.asarray(base.restart_B) == L).all()

  tracked = np.asarray(state.aux.tracked_BxT)
  probs = lambda tokens: np.asarray(_layer0_probs(
      params, config, tokens, model.positions_BxN, valid_BxN, tracked))
  want0 = _cosine_mean(probs(prev.tokens_BxN), probs(state.tokens_BxN),
                       tracked, np.asarray(valid_BxN))
  np.testing.assert_allclose(sims[:, 0], want0, rtol=1e-5)

  def expected(gamma):
    below = sims < gamma
    return np.where(below.any(1), below.argmax(1) + 1, L)

  # gamma just above a row's layer-0 similarity restarts it after layer 0;
  # just above its layer-1 one (when lower) after layer 1.
  b1 = int(np.argmax(sims[:, 1] < sims[:, 0]))
  assert sims[b1, 1] < sims[b1, 0], "no row drifts more at layer 1"
  seen = set()
  for gamma in (float(sims[0, 0]) + 1e-5, float(sims[b1, 1]) + 1e-5):
    want = expected(gamma)
    seen |= set(want.tolist())
    trace = jax.jit(lambda st, s=sampler(gamma): s.step_trace(
        model, st, p_len))(state)
    np.testing.assert_array_equal(trace.restart_B, want)
    got = np.asarray(trace.similarity_BxL)
    for b, r in enumerate(want):
      np.testing.assert_allclose(got[b, :r], sims[b, :r], rtol=1e-6)
      assert np.isnan(got[b, r:]).all()
      if r < L:
        _check_recomputed_from(config, params, model, state.aux, trace, b, r)
  assert {1, 2} <= seen, f"no mid-depth restart among {seen}"


def _check_recomputed_from(config, params, model, old, trace, b, r):
  """Layer r's input is its stored hidden states with the query rows
  replaced; layers >= r of row b hold a whole-sequence recomputation from
  it; layers r - 1 and r kept their stale non-query rows."""
  new = trace.aux
  slots = np.asarray(trace.slots_BxQ[b])
  stale = np.asarray(model.valid_BxN[b]).copy()
  stale[slots[slots >= 0]] = False
  for l in (r - 1, r):
    np.testing.assert_array_equal(np.asarray(new.hidden[l][b])[stale],
                                  np.asarray(old.hidden[l][b])[stale])
  inputs, keys = _recompute_from(
      config, int(r), params, new.hidden[r][b:b + 1],
      model.positions_BxN[b:b + 1], model.valid_BxN[b:b + 1])
  for l, x, k in zip(range(r, config.n_layers), inputs, keys):
    np.testing.assert_allclose(new.hidden[l][b], x[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new.cache.k[l][b], k[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,message", [
    (dict(window=0), "window must be a positive int"),
    (dict(gen_length=8, window=16), r"window \(16\) must be <= gen_length"),
    (dict(track_num=0), "track_num must be a positive int"),
    (dict(gamma="high"), "gamma must be a real number"),  # NaN: test_sampler_options
    (dict(threshold=0.0), "threshold must be in"),
    (dict(forced_commits=17), r"forced_commits must be None or an int in"),
    (dict(refresh_every=0), "refresh_every must be None or a positive int"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match="invalid Elastic-Cache arguments: "
                     + message):
    ElasticCacheSampler(**kwargs)


def test_forced_schedule_commits_a_fixed_number_per_step():
  config, params = tiny("llada")
  sampler = ElasticCacheSampler(gen_length=24, window=4, forced_commits=3)
  out = generate(params, random_prompts(28, [5, 9]), config=config,
                 sampler=sampler, stop_at_eos=False)
  assert out.steps == 8 and (out.forwards_B == 8).all()
  assert not (out.tokens_BxG == config.mask_token_id).any()
