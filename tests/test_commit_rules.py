"""The commit rules (sampling/commit_rules.py): threshold, factor and fixed
by hand and against the reference's loops, and their policy objects as the
samplers build them."""

import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.sampling import ElasticCacheSampler, FastDLLMSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling import commit_rules as rules
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests import fast_dllm_reference as ref

T, F = True, False


def _rule(fn, conf, masked, arg):
  out = fn(jnp.asarray(conf, jnp.float32), jnp.asarray(masked), arg)
  return np.asarray(out).tolist()


def test_threshold_rule_hand_made():
  conf = [[0.95, 0.2, 0.91, 0.5],
          [0.3, 0.6, 0.6, 0.1],    # all below tau, tie at the top
          [0.99, 0.99, 0.1, 0.2],  # nothing masked
          [0.9, 0.2, 0.95, 0.9]]   # conf == tau passes; 0.95 is not masked
  masked = [[T] * 4, [T] * 4, [F] * 4, [T, T, F, T]]
  assert _rule(rules.threshold_commit, conf, masked, 0.9) == [
      [T, F, T, F], [F, T, F, F], [F] * 4, [T, F, F, T]]
  # tau = 1: exactly one (the top) per row with a mask.
  got = np.array(_rule(rules.threshold_commit, conf, masked, 1.0))
  assert got.sum(1).tolist() == [1, 1, 0, 1]


def test_factor_rule_hand_made():
  # f = 1: rank thresholds -1, 2/3, 3/4, 4/5, 5/6.
  conf = [[0.9, 0.7, 0.76, 0.1, 0.5],   # 0.9, 0.76 pass; 0.7 < 3/4 stops
          [0.1, 0.05, 0.0, 0.0, 0.0],   # m = 2: the reference takes both
          [0.95, 0.9, 0.3, 0.0, 0.0],   # fails only at the last rank: all 3
          [0.99, 0.5, 0.4, 0.3, 0.2],   # fails at rank 2: just the top
          [0.99, 0.98, 0.97, 0.96, 0.2],  # 4 masked, all pass
          [0.4, 0.9, 0.9, 0.9, 0.9]]    # one masked: it
  masked = [[T] * 5, [T, T, F, F, F], [T, T, T, F, F], [T] * 5,
            [T, T, T, T, F], [T, F, F, F, F]]
  want = [[T, F, T, F, F], [T, T, F, F, F], [T, T, T, F, F],
          [T, F, F, F, F], [T, T, T, T, F], [T, F, F, F, F]]
  assert _rule(rules.factor_commit, conf, masked, 1.0) == want
  assert _rule(rules.factor_commit, conf, [[F] * 5] * 6, 1.0) == [[F] * 5] * 6


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0])
def test_rules_match_reference_loops_on_random_inputs(factor):
  rng = np.random.default_rng(0)
  conf = 1 - rng.random((200, 16)) ** 3 * 0.6  # many near the thresholds
  masked = rng.random((200, 16)) < 0.7
  masked[:5] = False
  masked[5:10] = True
  masked[10:15] = False
  masked[10:15, 3] = True
  conf = conf.astype(np.float32).astype(np.float64)  # exact in float32
  for fn, rfn, arg in [(rules.factor_commit, ref.transfer_factor, factor),
                       (rules.threshold_commit, ref.transfer_threshold, 0.85)]:
    got = np.array(_rule(fn, conf, masked, arg))
    want = np.array([rfn(c, m, arg) for c, m in zip(conf, masked)])
    np.testing.assert_array_equal(got, want)


def test_fixed_rule_and_confidence():
  conf = [[0.5, 0.9, 0.9, 0.1], [0.5, 0.9, 0.9, 0.1]]
  masked = [[T, T, T, T], [T, F, F, T]]
  got = _rule(rules.fixed_commit, conf, masked, jnp.array([2, 3]))
  assert got == [[F, T, T, F], [T, F, F, T]]  # ties: lower index; <= masked
  logits = np.random.default_rng(1).normal(0, 30, (2, 5, 64)).astype(np.float32)
  logits[0, 0] = 1e4 * np.arange(64) / 64  # huge spread: no overflow
  x0, conf = rules.confidence(jnp.asarray(logits))
  want_x0, want_conf = ref._confidence(logits.reshape(-1, 64))
  np.testing.assert_array_equal(np.asarray(x0).ravel(), want_x0)
  np.testing.assert_allclose(np.asarray(conf).ravel(), want_conf, rtol=2e-6)



def test_policy_objects_are_the_rules():
  rng = np.random.default_rng(2)
  conf = jnp.asarray(rng.random((3, 8)), jnp.float32)
  masked = jnp.asarray(rng.random((3, 8)) < 0.6)
  step_B = jnp.array([0, 1, 5])
  same = lambda a, b: np.testing.assert_array_equal(np.asarray(a),
                                                    np.asarray(b))
  same(rules.make("threshold", threshold=0.7).commit(conf, masked, step_B),
       rules.threshold_commit(conf, masked, 0.7))
  same(rules.make("factor", factor=2.0).commit(conf, masked, step_B),
       rules.factor_commit(conf, masked, 2.0))
  # Fixed: counts[step] a row; past the schedule's end its last count.
  same(rules.make("fixed", counts=(3, 2, 1)).commit(conf, masked, step_B),
       rules.fixed_commit(conf, masked, jnp.array([3, 2, 1])))
  with pytest.raises(ValueError, match="rule must be one of"):
    rules.make("greedy")


def test_even_counts_is_llada_schedule():
  assert rules.even_counts(8, 3) == (3, 3, 2)
  assert rules.even_counts(24, 8) == (3,) * 8
  llada = LLaDASampler(gen_length=32, steps=12, block_length=8)
  assert llada.transfer_counts().tolist() == list(rules.even_counts(8, 3)) * 4


def test_every_parallel_sampler_names_the_rule_the_same_way():
  """rule="fixed" with `steps` is one schedule everywhere: Fast-dLLM's per
  block, the window samplers' over the whole generation."""
  fast = FastDLLMSampler(gen_length=32, block_length=8, rule="fixed", steps=8)
  assert fast.commit_rule == rules.Fixed((4, 4))
  for sampler in (FlashDLLMSampler(gen_length=24, rule="fixed", steps=8),
                  ElasticCacheSampler(gen_length=24, window=4, rule="fixed",
                                      steps=8)):
    assert sampler.commit_rule == rules.Fixed((3,) * 8)
  for cls in (FastDLLMSampler, FlashDLLMSampler, ElasticCacheSampler):
    assert cls(threshold=0.8).commit_rule == rules.Threshold(0.8)
  assert FastDLLMSampler(rule="factor", factor=0.5).commit_rule == \
      rules.Factor(0.5)
