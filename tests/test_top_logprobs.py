"""Alternatives of committed tokens (sampling/top_logprobs.py) against
plain JAX: Flash-dLLM with an unlimited budget, whose window logits are a
full forward of the pre-step tokens and whose verify pass is
independent_forward.verify_pass (as in test_flash_verify)."""

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.state import advance
from flash_dllm_jax.sampling.top_logprobs import TopLogprobs, of_logits
from tests import independent_forward
from tests.test_flash_verify import start
from tests.test_sampling import tiny

K = 4


def _reference(logits_XxV):
  """(log-probs [X, K], ids [X, K]) of the K likeliest, by numpy."""
  lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits_XxV, jnp.float32)))
  ids = np.argsort(-lp, axis=-1, kind="stable")[:, :K]
  return np.take_along_axis(lp, ids, -1), ids


def _check(got_lp, got_id, logits_XxV, own_X):
  want_lp, want_id = _reference(logits_XxV)
  np.testing.assert_allclose(got_lp, want_lp, rtol=1e-4, atol=1e-4)
  gaps = np.abs(np.diff(want_lp, axis=-1)) > 1e-4  # ties may swap
  same = np.concatenate([gaps[:, :1], gaps[:, 1:] & gaps[:, :-1]], 1)
  assert (got_id[:, 1:][same] == want_id[:, 1:][same]).all()
  assert (got_id[:, 0] == want_id[:, 0])[gaps[:, 0]].all()
  hit = got_id == np.asarray(own_X)[:, None, 0]
  assert (got_lp[hit] == np.broadcast_to(np.asarray(own_X)[:, 1:],
                                         got_lp.shape)[hit]).all()


def test_of_logits_is_the_softmax_top_k_with_the_chosen_value():
  logits = 3 * jax.random.normal(jax.random.key(0), (2, 3, 50))
  chosen = jnp.array([[0, 5, 7], [1, 2, 3]])
  top = jnp.argmax(logits, -1)
  chosen = chosen.at[0, 0].set(top[0, 0])  # one chosen token is the top
  own = jnp.take_along_axis(jax.nn.log_softmax(logits), chosen[..., None],
                            -1)[..., 0] + 1e-3  # a value of its own
  lp, ids = of_logits(logits, K, chosen, own)
  assert lp[0, 0, 0] == own[0, 0] and ids[0, 0, 0] == chosen[0, 0]
  flat = lambda x: np.asarray(x).reshape(6, *x.shape[2:])
  want_lp, want_id = _reference(flat(logits))
  assert (flat(ids) == want_id).all()
  mine = flat(ids) == flat(chosen)[:, None]
  np.testing.assert_allclose(flat(lp)[~mine], want_lp[~mine], rtol=1e-5)


def test_each_committed_token_gets_the_alternatives_of_its_step():
  config, params = tiny("llada")
  sampler = FlashDLLMSampler(gen_length=16, block_m=8, track_num=40,
                             mask_num=4, threshold=0.95, verify=True,
                             gamma=0.3)
  model, state, p_len = start(config, params, sampler, [6, 13])
  b, n = state.tokens_BxN.shape
  state = state.replace(top=TopLogprobs.zeros(b, n, K))
  rows_BxN = jnp.broadcast_to(jnp.arange(n), (b, n))
  step = jax.jit(lambda st: sampler.step_trace(model, st, p_len))
  full = jax.jit(lambda t: model.logits(t, rows_BxN))
  verify_pass = jax.jit(independent_forward.verify_pass, static_argnums=1)
  windows = verified = 0
  while not bool(state.done_B.all()) and int(state.step) < 16:
    trace = step(state)
    top_lp, top_id = (np.asarray(x) for x in (trace.top.lp_BxNxK,
                                               trace.top.id_BxNxK))
    lp_BxN = np.asarray(trace.logprob_BxN)
    written = np.asarray((trace.tokens_BxN != state.tokens_BxN)
                         & (state.tokens_BxN == config.mask_token_id)
                         & ~state.done_B[:, None])
    from_verify = np.zeros_like(written)
    plan = trace.plan
    if int(plan.S_B.max()) > 0:
      logits = np.asarray(verify_pass(
          params, config, state.tokens_BxN, model.positions_BxN,
          model.valid_BxN, plan.slots_BxQ, plan.tokens_BxQ, plan.exclude_BxS,
          plan.inq_BxQxQ, plan.score_rows_BxC))
      slots_BxC = np.take_along_axis(np.asarray(plan.slots_BxQ),
                                     np.asarray(plan.mask_rows_BxC), 1)
      r, c = np.nonzero(np.asarray(trace.keep_BxC))
      s = slots_BxC[r, c]
      from_verify[r, s] = True
      own = np.stack([np.asarray(trace.tokens_BxN)[r, s], lp_BxN[r, s]], 1)
      _check(top_lp[r, s], top_id[r, s], logits[r, c], own)
      verified += len(r)
    r, s = np.nonzero(written & ~from_verify)
    logits = np.asarray(full(state.tokens_BxN))
    own = np.stack([np.asarray(trace.tokens_BxN)[r, s], lp_BxN[r, s]], 1)
    _check(top_lp[r, s], top_id[r, s], logits[r, s], own)
    windows += len(r)
    kept = state.top
    state = advance(state, trace.tokens_BxN, trace.aux, trace.forwards_B,
                    p_len, config.mask_token_id, config.stop_token_ids,
                    state.rng_B, logprob_BxN=trace.logprob_BxN, top=trace.top)
    # what advance keeps: the step's where written, the earlier elsewhere
    now = np.asarray(state.top.lp_BxNxK)
    assert (now[written] == top_lp[written]).all()
    assert (now[~written] == np.asarray(kept.lp_BxNxK)[~written]).all()
  assert windows > 0 and verified > 0, (windows, verified)
