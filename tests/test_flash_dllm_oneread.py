"""Flash-dLLM one-read: each step's one forward verifies the last step's
drafts and decodes the window (flash_dllm_oneread.py)."""

import numpy as np
import pytest

from flash_dllm_jax import strategies
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling.flash_dllm_oneread import FlashDLLMOneReadSampler
from tests.test_sampling import (check_compiled_equals_python,
                                 check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 full_logits_fn, random_prompts, tiny)

SMALL = FlashDLLMOneReadSampler(gen_length=24, block_m=4, track_num=2,
                                mask_num=2, threshold=0.9, gamma=0.4)
# every position in the query each step: the cache is exact
UNLIMITED = FlashDLLMOneReadSampler(gen_length=24, block_m=4, track_num=40,
                                    mask_num=7, threshold=0.9, gamma=0.3)


def _oracle(logits_fn, prompt, s, mask_id):
  """The module docstring's rule as a plain loop over one row, every step
  an uncached forward of the whole sequence (no answer end: stop_at_eos
  off). Returns (generation, steps, drafts accepted)."""
  x = list(prompt) + [mask_id] * s.gen_length
  c, drafts, steps, accepted_total = s.block_m // 2, {}, 0, 0
  while mask_id in x[len(prompt):]:
    lg = logits_fn(np.asarray([x]))[0].astype(np.float64)
    probs = np.exp(lg - lg.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    window = [i for i in range(len(prompt), len(x)) if x[i] == mask_id
              ][:s.block_m]
    x0 = {i: int(np.argmax(lg[i])) for i in window}
    conf = {i: probs[i, x0[i]] for i in window}
    cands = sorted((i for i in window if i in drafts),
                   key=lambda i: drafts[i][1])[:c]
    accepted, cum = [], 1.0
    for i in cands:
      cum *= probs[i, drafts[i][0]]
      if cum < s.gamma:
        break
      accepted.append(i)
    rest = [i for i in window if i not in accepted]
    ruled = {i for i in rest if conf[i] >= s.threshold}
    if rest:
      ruled.add(max(rest, key=lambda i: (conf[i], -i)))
    for i in accepted:
      x[i] = drafts[i][0]
    for i in ruled:
      x[i] = x0[i]
    left = [i for i in window if x[i] == mask_id]
    left = sorted(left, key=lambda i: -conf[i])[:c]  # stable: window order
    drafts = {i: (x0[i], k) for k, i in enumerate(left)}
    steps, accepted_total = steps + 1, accepted_total + len(accepted)
  return x[len(prompt):], steps, accepted_total


def test_compiled_decode_equals_the_rule_as_a_plain_loop():
  """Unlimited budget (the cache holds nothing stale): tokens and step
  counts equal the oracle's, which accepts some drafts."""
  config, params = tiny("llada")
  prompts = random_prompts(51, [5, 11])
  out = generate(params, prompts, config=config, sampler=UNLIMITED,
                 stop_at_eos=False)
  accepted = 0
  for i, p in enumerate(prompts):
    gen, steps, acc = _oracle(full_logits_fn(config, params), p, UNLIMITED,
                              config.mask_token_id)
    np.testing.assert_array_equal(out.tokens_BxG[i], gen)
    assert out.steps_B[i] == steps
    accepted += acc
  assert accepted > 0, "no draft was ever accepted"
  assert (out.forwards_B == out.steps_B).all()


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
  prefill); every answer token is a real id; no mask is left."""
  config, params = tiny("llada", eos_boost=eos_boost)
  out = generate(params, random_prompts(26, [6, 17]), config=config,
                 sampler=SMALL)
  np.testing.assert_array_equal(out.forwards_B, out.steps_B)
  assert out.steps <= SMALL.num_steps
  assert ((out.tokens_BxG >= 0) & (out.tokens_BxG < config.vocab_size)
          & (out.tokens_BxG != config.mask_token_id)).all()


def test_registered_as_its_own_strategy():
  s = strategies.build_sampler("flash-dllm-oneread", "llada",
                               {"gamma": 0.5})
  assert isinstance(s, FlashDLLMOneReadSampler) and s.gamma == 0.5
  assert "flash-dllm-oneread" in strategies.strategies_for("dream")
  assert type(strategies.build_sampler("flash-dllm", "llada", {})).__name__ \
      == "FlashDLLMSampler"
  with pytest.raises(ValueError, match="always verifies"):
    FlashDLLMOneReadSampler(verify=False)
