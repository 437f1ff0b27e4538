"""Flash-Verify: the verify pass's layout and acceptance, checked against an
independent uncached forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling import flash_verify
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState, advance
from tests import independent_forward
from tests.test_sampling import random_prompts, tiny


def test_independent_forward_matches_the_model():
  config, params = tiny("llada")
  tokens = jnp.asarray(random_prompts(30, [12, 12]))
  pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
  valid = jnp.ones((2, 12), bool)
  rows = jnp.broadcast_to(jnp.arange(12), (2, 12))
  model = SequenceModel.for_batch(config, params, valid)
  want = jax.jit(model.logits)(tokens, rows)
  got = jax.jit(independent_forward.forward, static_argnums=1)(
      params, config, tokens, pos, jnp.ones((2, 12, 12), bool), rows)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_verify_plan_follows_the_attention_pattern():
  # block_m 4: 8 rows; 1 candidate -> 6 recent, 1 draft, 1 mask.
  tokens = jnp.array([[5, 6, 7, 9, 99, 11, 99, 12]])  # 99 = mask
  committed = jnp.array([[-1, -1, -1, 0, -1, 1, -1, 1]], jnp.float32)
  key = jnp.where(tokens != 99, committed * 8 + jnp.arange(8), -jnp.inf)
  plan = flash_verify.plan(tokens, key, jnp.array([[4, -1]]),
                           jnp.array([[42, 0]]), jnp.array([1]), 4, 99)
  assert plan.S_B.tolist() == [1]
  assert plan.slots_BxQ[0].tolist() == [7, 5, 3, 2, 1, 0, 4, 4]
  assert plan.tokens_BxQ[0].tolist() == [12, 11, 9, 7, 6, 5, 42, 99]
  assert plan.kind_BxQ[0].tolist() == [0] * 6 + [1, 2]
  inq = np.asarray(plan.inq_BxQxQ[0])
  assert inq[:6, :6].all() and inq[:6, 7].all() and not inq[:6, 6].any()
  assert inq[6].tolist() == [True] * 6 + [True, False]   # draft 0: self only
  assert inq[7].tolist() == [True] * 6 + [False, True]   # mask 0: self only
  assert np.asarray(plan.exclude_BxS[0]).tolist() == [True] * 6 + [False, True]
  assert plan.mask_rows_BxC[0].tolist() == [7, 0]


def test_verify_pattern_between_candidates():
  # block_m 4, 2 candidates: rows 0-3 recent, 4-5 draft, 6-7 mask.
  tokens = jnp.arange(10)[None] % 7
  key = jnp.where(jnp.arange(10)[None] < 6, jnp.arange(10)[None] * 1.0,
                  -jnp.inf)
  plan = flash_verify.plan(tokens, key, jnp.array([[8, 6]]),
                           jnp.array([[1, 2]]), jnp.array([2]), 4, 99)
  inq = np.asarray(plan.inq_BxQxQ[0])
  d0, d1, m0, m1 = 4, 5, 6, 7
  assert inq[d1, d0] and inq[d1, d1] and not inq[d0, d1]   # drafts j <= i
  assert inq[d0, m1] and not inq[d0, m0] and not inq[d1, m1]  # masks j > i
  assert inq[m1, d0] and not inq[m1, d1] and not inq[m0, d0]  # drafts j < i
  assert inq[m0, m0] and inq[m0, m1] and inq[m1, m1] and not inq[m1, m0]
  assert plan.mask_rows_BxC[0].tolist() == [6, 7]


def test_dream_verify_plan_reads_each_candidate_from_position_minus_one():
  """block_m 8, candidates (confidence order) at 4, 6, 7, 5: candidate 2's
  predecessor is candidate 1, so draft row 1 is read; the others get
  predictor rows at 3 (an old decoded token left to the cache), 5 (a later
  candidate: [MASK]) and 4 (an earlier candidate: its draft)."""
  mask = 99
  tokens = jnp.where((jnp.arange(10) >= 4) & (jnp.arange(10) < 8), mask,
                     10 + jnp.arange(10))[None]
  key = jnp.array([[5, 4, 3, 0, -jnp.inf, -jnp.inf, -jnp.inf, -jnp.inf, 2,
                    1]])
  plan = flash_verify.plan(tokens, key, jnp.array([[4, 6, 7, 5]]),
                           jnp.array([[40, 41, 42, 43]]), jnp.array([4]), 8,
                           mask, shift=1)
  # 5 recent rows (slot 3 is the oldest and left out), 4 draft, 4 mask, 3
  # predictor rows
  assert plan.slots_BxQ[0].tolist() == [0, 1, 2, 8, 9, 4, 6, 7, 5, 4, 6, 7, 5,
                                        3, 5, 4]
  assert plan.tokens_BxQ[0, 13:].tolist() == [13, mask, 40]
  assert plan.kind_BxQ[0, 13:].tolist() == [flash_verify.PREDICT] * 3
  assert plan.rank_BxQ[0, 13:].tolist() == [0, 1, 3]
  assert plan.mask_rows_BxC[0].tolist() == [9, 10, 11, 12]
  assert plan.score_rows_BxC[0].tolist() == [13, 14, 6, 15]
  inq = np.asarray(plan.inq_BxQxQ[0])
  for row, mask_row in [(13, 9), (14, 10), (6, 11), (15, 12)]:
    assert inq[row].tolist() == inq[mask_row].tolist()
  assert not inq[:, 13:].any()
  # predictor slots stay visible in the cache (slot 3 is nobody's row)
  assert np.asarray(plan.exclude_BxS[0]).tolist() == [True] * 3 + [False] + [
      True] * 6


def test_accept_takes_the_longest_prefix_above_gamma():
  p = jnp.array([[0.9, 0.9, 0.5, 0.99], [0.7, 0.99, 0.99, 0.99],
                 [0.95, 0.95, 0.95, 0.95]])
  keep = flash_verify.accept(p, jnp.array([4, 4, 2]), 0.8)
  assert keep.tolist() == [[True, True, False, False],
                           [False, False, False, False],
                           [True, True, False, False]]


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_every_accepted_draft_passes_an_independent_verify_pass(arch):
  """Unlimited budget: the cache equals a full forward of the pre-step
  tokens, so the verify pass is re-computed uncached on an extended sequence
  [context | verify rows] with the plan's pattern, and its probabilities
  must match and decide acceptance. For Dream the probabilities are read
  from the predictor rows (position c_i - 1 in candidate i's mask view)."""
  config, params = tiny(arch)
  sampler = FlashDLLMSampler(gen_length=24, block_m=8, track_num=40,
                             mask_num=4, threshold=0.95, verify=True,
                             gamma=0.3)
  model, state, p_len = start(config, params, sampler, [6, 13])
  valid_BxN = model.valid_BxN
  step = jax.jit(lambda st: sampler.step_trace(model, st, p_len))
  verify_pass = jax.jit(independent_forward.verify_pass, static_argnums=1)
  accepted = predictors = reused = 0
  while not bool(state.done_B.all()) and int(state.step) < 24:
    trace = step(state)
    plan = trace.plan
    if int(plan.S_B.max()) > 0:
      logits = verify_pass(
          params, config, state.tokens_BxN, model.positions_BxN, valid_BxN,
          plan.slots_BxQ, plan.tokens_BxQ, plan.exclude_BxS, plan.inq_BxQxQ,
          plan.score_rows_BxC)
      drafts = jnp.take_along_axis(
          plan.tokens_BxQ, jnp.maximum(plan.mask_rows_BxC - plan.S_B[:, None], 0), 1)
      p = jnp.exp(jnp.take_along_axis(jax.nn.log_softmax(logits, -1),
                                      drafts[..., None], -1)[..., 0])
      real_c = jnp.arange(p.shape[1])[None] < plan.S_B[:, None]
      np.testing.assert_allclose(np.where(real_c, trace.p_BxC, 0),
                                 np.where(real_c, p, 0), rtol=1e-4, atol=1e-5)
      cum = np.cumprod(np.where(real_c, np.asarray(p), 1.0), axis=1)
      decided = np.abs(cum - sampler.gamma) > 1e-4
      want = np.asarray(real_c) & (cum >= sampler.gamma)
      got = np.asarray(trace.keep_BxC)
      assert (got == want)[decided].all()
      accepted += int(got.sum())
      if config.logits_shift:
        added, shared = _check_predictors(plan, trace.tokens_BxN,
                                          config.mask_token_id)
        predictors, reused = predictors + added, reused + shared
      else:
        np.testing.assert_array_equal(plan.score_rows_BxC, plan.mask_rows_BxC)
    state = advance(state, trace.tokens_BxN, trace.aux, trace.forwards_B,
                    p_len, config.mask_token_id, config.stop_token_ids,
                    state.rng_B)
  assert accepted > 0, "no draft was ever verified and accepted"
  if config.logits_shift:  # both ways of reading a Dream candidate occurred
    assert predictors > 0 and reused > 0, (predictors, reused)


def start(config, params, sampler, lengths, seed=31):
  """(model, the decode state before its first step, prompt length) of
  prompts random_prompts(seed, lengths), stepped by hand in the tests."""
  b, g = len(lengths), sampler.gen_length
  ids, valid = left_pad(random_prompts(seed, lengths), config.pad_token_id)
  valid_BxN = jnp.concatenate([jnp.asarray(valid), jnp.ones((b, g), bool)], 1)
  model = SequenceModel.for_batch(config, params, valid_BxN)
  state = DecodeState.start(jnp.asarray(ids), g, config.mask_token_id,
                            jax.vmap(jax.random.key)(jnp.arange(
                                b, dtype=jnp.uint32)))
  return (model, state.replace(aux=sampler.init_aux(model, state.tokens_BxN)),
          ids.shape[1])


def _check_predictors(plan, tokens_BxN, mask_id):
  """Dream: candidate i is scored at slot c_i - 1, holding that slot's token
  in i's mask view, with mask row i's visibility; no row sees a predictor
  row. Returns (predictor rows added, candidates read from draft row
  i - 1)."""
  kind, rank = np.asarray(plan.kind_BxQ), np.asarray(plan.rank_BxQ)
  slots, toks = np.asarray(plan.slots_BxQ), np.asarray(plan.tokens_BxQ)
  inq, tokens = np.asarray(plan.inq_BxQxQ), np.asarray(tokens_BxN)
  added = shared = 0
  for b in range(kind.shape[0]):
    cand = {int(rank[b, r]): r for r in np.flatnonzero(
        kind[b] == flash_verify.DRAFT)}
    for i in range(int(plan.S_B[b])):
      mask_row = int(plan.mask_rows_BxC[b, i])
      row = int(plan.score_rows_BxC[b, i])
      assert slots[b, row] == slots[b, mask_row] - 1
      np.testing.assert_array_equal(inq[b, row], inq[b, mask_row])
      if kind[b, row] == flash_verify.DRAFT:  # draft row i - 1, reused
        assert rank[b, row] == i - 1
        shared += 1
        continue
      assert kind[b, row] == flash_verify.PREDICT and rank[b, row] == i
      assert not inq[b, :, row].any()
      at = [k for k in cand if slots[b, cand[k]] == slots[b, row]]
      if at:  # an earlier candidate holds its draft, a later one [MASK]
        want = toks[b, cand[at[0]]] if at[0] < i else mask_id
      else:  # not a candidate: verification leaves its token alone
        want = tokens[b, slots[b, row]]
      assert toks[b, row] == want
      added += 1
  return added, shared
