"""Elastic-Cache's drift test: it restarts where a from-scratch reference
of layer 0's attention would (at the sampler's gamma or a row's own), and
recomputes the layers from there."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.model import KVCache, init_params, layerwise
from flash_dllm_jax.sampling import DecodeState, ElasticCacheSampler
from flash_dllm_jax.sampling.row_sampling import RowSampling, Sampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import advance
from tests.independent_forward import _rms, _rope
from tests.test_sampling import random_prompts


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
  # each row's own gamma (row data) restarts it where the sampler built
  # with that gamma would: row 0 never, row 1 after layer 1
  gammas = (float(sims[0].min()) - 1e-3, float(sims[1, 1]) + 1e-5)
  rows = state.replace(sampling=RowSampling.of(
      [Sampling(gamma=g) for g in gammas]))
  trace = jax.jit(lambda st: never.step_trace(model, st, p_len,
                                              st.rng_B))(rows)
  want = [int(expected(g)[b]) for b, g in enumerate(gammas)]
  np.testing.assert_array_equal(trace.restart_B, want)
  assert all(want != expected(g).tolist() for g in gammas)  # both count


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
