"""Flash-dLLM one-pass: each step's forward carries the verify rows of the
last step's drafts (flash_dllm_onepass.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import strategies
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling import flash_verify
from flash_dllm_jax.sampling.flash_dllm_onepass import FlashDLLMOnePassSampler
from flash_dllm_jax.sampling.state import advance
from tests.test_flash_verify import start
from tests.test_sampling import (check_compiled_equals_python,
                                 check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 random_prompts, tiny)

SMALL = FlashDLLMOnePassSampler(gen_length=24, block_m=4, track_num=2,
                                mask_num=2, threshold=0.9, gamma=0.4)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_side_rows_equal_a_separate_verify_pass(arch):
  """The side rows' probabilities equal a separate Flash-Verify pass of the
  same plan (flash_verify.run_pass) over the cache the step's budget rows
  wrote, which is what the side rows see: one forward computes what the
  two-pass form would. Acceptance follows the cumulative rule, an accepted
  draft is committed with its own token, and some drafts are accepted, some
  not."""
  config, params = tiny(arch)
  sampler = FlashDLLMOnePassSampler(gen_length=24, block_m=8, track_num=4,
                                    mask_num=2, threshold=0.95, gamma=0.3)
  model, state, p_len = start(config, params, sampler, [6, 13])
  step = jax.jit(lambda st: sampler.step_trace(model, st, p_len))
  separate = jax.jit(lambda plan, cache, drafts: flash_verify.run_pass(
      model, plan, cache, drafts, plan.exclude_BxS))
  verified = accepted = 0
  while not bool(state.done_B.all()) and int(state.step) < 24:
    trace = step(state)
    plan = trace.plan
    assert plan.slots_BxQ.shape[1] == sampler.side_rows(config.logits_shift)
    if int(plan.S_B.max()) > 0:
      drafts = state.aux.draft_BxC
      p = separate(plan, trace.aux.cache, jnp.maximum(drafts, 0))
      real_c = jnp.arange(p.shape[1])[None] < plan.S_B[:, None]
      np.testing.assert_allclose(np.where(real_c, trace.p_BxC, 0),
                                 np.where(real_c, p, 0), rtol=1e-5, atol=1e-6)
      cum = np.cumprod(np.where(real_c, np.asarray(p), 1.0), axis=1)
      decided = np.abs(cum - sampler.gamma) > 1e-4
      want = np.asarray(real_c) & (cum >= sampler.gamma)
      got = np.asarray(trace.keep_BxC)
      assert (got == want)[decided].all()
      verified += int(plan.S_B.sum())
      accepted += int(got.sum())
      slots = np.asarray(state.aux.cand_BxC)
      for b, c in zip(*np.nonzero(got)):
        assert int(trace.tokens_BxN[b, slots[b, c]]) == int(drafts[b, c])
    state = advance(state, trace.tokens_BxN, trace.aux, trace.forwards_B,
                    p_len, config.mask_token_id, config.stop_token_ids,
                    state.rng_B)
  assert accepted > 0 and verified > accepted, (accepted, verified)


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_compiled_loop_equals_python_loop(arch):
  check_compiled_equals_python(arch, SMALL, 1.2, 22, [5, 12, 8])


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_rows_do_not_depend_on_the_batch(arch):
  batch = check_rows_do_not_depend_on_the_batch(arch, SMALL, 1.2, 23,
                                                [4, 13, 30])
  assert not (batch.tokens_BxG == tiny(arch)[0].mask_token_id).any()


def test_continuous_batching_equals_each_request_alone():
  check_continuous_equals_alone("llada", SMALL, 1.2, [4, 19, 9, 30, 6])


@pytest.mark.parametrize("eos_boost", [0.0, 1.2])
def test_one_forward_a_step_and_a_complete_answer(eos_boost):
  """A row's forwards equal its steps (the first step's forward is its
  prefill); every answer token is a real id; no mask is left. Three
  prompts: the batch shape of the tests above, whose program runs."""
  config, params = tiny("llada", eos_boost=eos_boost)
  out = generate(params, random_prompts(26, [6, 17, 11]), config=config,
                 sampler=SMALL)
  np.testing.assert_array_equal(out.forwards_B, out.steps_B)
  assert out.steps <= SMALL.num_steps
  assert ((out.tokens_BxG >= 0) & (out.tokens_BxG < config.vocab_size)
          & (out.tokens_BxG != config.mask_token_id)).all()


def test_registered_as_its_own_strategy():
  s = strategies.build_sampler("flash-dllm-onepass", "llada", {"gamma": 0.5})
  assert isinstance(s, FlashDLLMOnePassSampler) and s.gamma == 0.5
  assert "flash-dllm-onepass" in strategies.strategies_for("dream")
  assert type(strategies.build_sampler("flash-dllm", "llada", {})).__name__ \
      == "FlashDLLMSampler"
  with pytest.raises(ValueError, match="always verifies"):
    FlashDLLMOnePassSampler(verify=False)
