"""Flash-Cache (Flash-dLLM without verification)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.generate import decode_jit, generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling import flash_budget
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests.test_sampling import (check_compiled_equals_python,
                                 check_continuous_equals_alone,
                                 check_rows_do_not_depend_on_the_batch,
                                 generate_args, random_prompts, tiny)

UNLIMITED = dict(gen_length=24, block_m=4, track_num=40, mask_num=7,
                 threshold=0.6)


@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("eos_boost", [0.0, 1.2])
def test_unlimited_budget_equals_full_recomputation(arch, eos_boost):
  """With every position in the query each step, the cache holds nothing
  stale, so the cached run must give exactly the uncached run's tokens."""
  config, params = tiny(arch, eos_boost=eos_boost)
  prompts = random_prompts(21, [5, 14, 9])
  sampler = FlashDLLMSampler(**UNLIMITED)
  assert sampler.query_budget >= 14 + 24
  cached = generate(params, prompts, config=config, sampler=sampler)
  full = generate(params, prompts, config=config,
                  sampler=FlashDLLMSampler(**UNLIMITED, recompute_all=True))
  np.testing.assert_array_equal(cached.tokens_BxG, full.tokens_BxG)
  np.testing.assert_array_equal(cached.forwards_B, full.forwards_B)
  assert cached.steps < 24  # the threshold commits several tokens per step


SMALL = FlashDLLMSampler(gen_length=24, block_m=4, track_num=2, mask_num=2,
                         threshold=0.6)
SMALL_VERIFY = FlashDLLMSampler(gen_length=24, block_m=4, track_num=2,
                                mask_num=2, threshold=0.9, verify=True,
                                gamma=0.4)


BY_ARCH = [("llada", SMALL), ("llada", SMALL_VERIFY), ("dream", SMALL_VERIFY)]


@pytest.mark.parametrize("arch,sampler", BY_ARCH)
def test_compiled_loop_equals_python_loop(arch, sampler):
  check_compiled_equals_python(arch, sampler, 1.2, 22, [5, 12, 8])


@pytest.mark.parametrize("arch,sampler", BY_ARCH)
def test_rows_do_not_depend_on_the_batch(arch, sampler):
  batch = check_rows_do_not_depend_on_the_batch(arch, sampler, 1.2, 23,
                                                [4, 13, 30])
  assert not (batch.tokens_BxG == tiny(arch)[0].mask_token_id).any()


@pytest.mark.parametrize("sampler,passes,seed", [(SMALL, 1, 25),
                                                 (SMALL_VERIFY, 2, 26)],
                         ids=["draft", "verify"])
@pytest.mark.parametrize("eos_boost", [0.0, 1.2])
def test_terminates_and_counts_its_passes(sampler, passes, seed, eos_boost):
  """No mask is left; a step runs the draft pass, and with verify a verify
  pass when it has candidates. The row that ran longest was active in every
  step, so without verify its forwards equal the steps. Three prompts: the
  batch shape of the compiled-loop and batch tests, whose program runs."""
  config, params = tiny("llada", eos_boost=eos_boost)
  out = generate(params, random_prompts(seed, [6, 17, 11]), config=config,
                 sampler=sampler)
  assert not (out.tokens_BxG == config.mask_token_id).any()
  assert out.steps <= sampler.num_steps
  assert out.forwards_B.max() >= out.steps
  assert (out.forwards_B >= 1).all()
  assert (out.forwards_B <= passes * out.steps).all()


@pytest.mark.parametrize("rule,window,extra", [
    ("leftmost", [2, 4], [5, 8]), ("confident", [5, 4], [2, 8])])
def test_query_selection_follows_the_budget(rule, window, extra):
  """leftmost: the first masks in position order, past the end too;
  confident: open masks by last confidence, never-scored ones after them in
  position order. Tracked: the last committed batch, then the best rank."""
  n = 10
  # positions 0-1 prompt, 2-9 generation; 3, 6 and 7 decoded (6 last batch)
  masked_BxN = jnp.array([[0, 0, 1, 0, 1, 1, 0, 0, 1, 1]], bool)
  decoded_BxN = ~masked_BxN
  end_B = jnp.array([9])  # position 9 is past the answer's end
  conf = jnp.full((1, n), -1.0).at[0, 5].set(0.7).at[0, 4].set(0.2)
  rank = jnp.zeros((1, n)).at[0, 1].set(5.0).at[0, 3].set(1.0)
  last = jnp.zeros((1, n), bool).at[0, 6].set(True)
  slots = np.asarray(flash_budget.select(
      masked_BxN, decoded_BxN, end_B, conf, rank, last, window_rule=rule,
      window=2, extra=2, tracked=3))[0]
  assert slots[:2].tolist() == window
  assert slots[2:4].tolist() == extra
  assert slots[4:].tolist() == [6, 1, 3]


def test_answer_end_follows_the_first_eos_batch():
  """"eos": the first batch holding EOS fixes the end one past its largest
  EOS; later EOS commits do not move it. "first": the first stop token."""
  n, eos, eot = 12, 7, 8
  slots = jnp.array([[3, 5, 9, -1]])
  toks = jnp.array([[eos, 1, eos, eos]])
  every = jnp.ones((1, 4), bool)
  none = jnp.array([n + 1])  # no end yet
  end = flash_budget.update_end(none, n, slots, toks, every, (eos,), "eos")
  assert end.tolist() == [10]
  again = flash_budget.update_end(end, n, jnp.array([[1]]), jnp.array([[eos]]),
                                  jnp.ones((1, 1), bool), (eos,), "eos")
  assert again.tolist() == [10]
  first = flash_budget.update_end(none, n, slots,
                                  jnp.array([[1, eot, eos, 1]]), every,
                                  (eos, eot), "first")
  assert first.tolist() == [6]


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_m=0), "block_m"), (dict(threshold=0.0), "threshold"),
    (dict(track_num=-1), "track_num"), (dict(rank_from_layer=-2),
                                        "rank_from_layer"),
    (dict(window_rule="best"), "window_rule"), (dict(end_rule="eot"), "end_rule"),
    (dict(rank="max"), "rank"),
    (dict(gamma=0.0), "gamma"), (dict(verify=True, block_m=1), "block_m >= 2"),
    (dict(verify=True, recompute_all=True), "cannot be combined"),
    (dict(rule="factor"), "rule must be one of"),
    (dict(steps=64), "applies to rule='fixed' only"),
    (dict(rule="fixed", steps=8), r"up to 32 tokens a step, more than block_m")])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    FlashDLLMSampler(**kwargs)


# Continuous batching -------------------------------------------------------------
@pytest.mark.parametrize("sampler", [SMALL, SMALL_VERIFY])
def test_continuous_batching_equals_each_request_alone(sampler):
  """Five requests through two slots in one compiled loop: every answer and
  forward count equals decoding that request alone."""
  check_continuous_equals_alone("llada", sampler, 1.2, [4, 19, 9, 30, 6])


@pytest.mark.parametrize("sampler", [SMALL, SMALL_VERIFY],
                         ids=["draft", "verify"])
def test_capped_refills_prefill_only_the_new_rows_and_change_no_answer(
    sampler):
  """max_refills=1: at most one slot takes a new request per loop step and
  that step prefills the new row alone; every answer still equals decoding
  the request alone and the uncapped queue's (the sampler's default
  max_refills, 4, caps nothing with two slots). The uncapped queue and the
  decodes alone are the programs of test_continuous_batching_equals_each_
  request_alone: only the capped queue compiles here."""
  config, params = tiny("llada", eos_boost=1.2)
  assert sampler.max_refills >= 2
  capped = dataclasses.replace(sampler, max_refills=1)
  prompts = random_prompts(46, [4, 19, 9, 30, 6])  # that test's shapes
  queued = generate(params, prompts, config=config, sampler=capped,
                    batch_size=2)
  free = generate(params, prompts, config=config, sampler=sampler,
                  batch_size=2)
  np.testing.assert_array_equal(queued.tokens_BxG, free.tokens_BxG)
  np.testing.assert_array_equal(queued.forwards_B, free.forwards_B)
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=sampler)
    np.testing.assert_array_equal(queued.tokens_BxG[i], alone.tokens_BxG[0])
  assert queued.steps >= free.steps
  with pytest.raises(ValueError, match="max_refills"):
    dataclasses.replace(sampler, max_refills=0)


def test_continuous_batching_needs_a_refillable_sampler():
  """The queue refuses a sampler that cannot reset a slot (generate decodes
  such samplers in fixed chunks instead)."""
  from flash_dllm_jax.sampling import continuous
  from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
  config, params = tiny("llada")
  ids, valid = left_pad(random_prompts(41, [3, 4, 5]), config.pad_token_id)
  rng_U = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
  with pytest.raises(ValueError, match="continuous batching"):
    continuous.decode_queue(params, jnp.asarray(ids), jnp.asarray(valid),
                            rng_U, config=config, batch_size=2,
                            sampler=LLaDASampler(gen_length=8, steps=8))


def _fixed(verify):
  return FlashDLLMSampler(gen_length=24, block_m=4, track_num=2, mask_num=2,
                          verify=verify, rule="fixed", steps=8)


FIXED_PROMPTS = random_prompts(42, [5, 9])


@pytest.mark.parametrize("verify", [False, True])
def test_fixed_rule_commits_a_fixed_number_per_step(verify):
  config, params = tiny("llada")
  out = generate(params, FIXED_PROMPTS, config=config, sampler=_fixed(verify),
                 stop_at_eos=False)
  assert out.steps == 8  # 24 tokens, 3 per step
  # 8 draft passes; with verify, 7 verify passes (the last window holds only
  # the 3 positions it commits, so nothing is left to verify)
  assert (out.forwards_B == (15 if verify else 8)).all()
  assert not (out.tokens_BxG == config.mask_token_id).any()


def test_fixed_rule_keeps_the_verify_pass_in_the_compiled_loop():
  """The benchmark schedule keeps no verified draft; the pass must still be
  compiled in (a pass whose output is unused is dead code to XLA, and the
  benchmark would time the draft pass alone). Lowered with the arguments
  generate passes: the programs of the test above, loaded from the run's
  compilation cache."""
  config, params = tiny("llada")
  ids, valid = left_pad(FIXED_PROMPTS, config.pad_token_id)
  rng = jax.vmap(jax.random.key)(jnp.arange(2, dtype=jnp.uint32))

  def dots(verify):
    hlo = decode_jit.lower(params, jnp.asarray(ids), jnp.asarray(valid), rng,
                           *generate_args(_fixed(verify), 2),
                           config=config, sampler=_fixed(verify),
                           stop_at_eos=False, implementation=None,
                           logprobs=False).compile().as_text()
    return hlo.count(" dot(")

  without, with_verify = dots(False), dots(True)
  # Each pass multiplies by every projection of every layer.
  assert with_verify >= without + 4 * config.n_layers, (without, with_verify)


@pytest.mark.parametrize("sampler", [SMALL, SMALL_VERIFY],
                         ids=["draft", "verify"])
def test_compiled_decode_is_one_loop_with_the_layers_unrolled(sampler):
  """The decode is one while loop whose body runs the layers unrolled: no
  inner loop over layer-stacked weights (which ran slower on the H200).
  The only inner loops prefill new rows, whole groups then single rows
  (flash_forward.prefill_rows).
  (The program of test_compiled_loop_equals_python_loop.)"""
  import re
  config, params = tiny("llada", eos_boost=1.2)
  ids, valid = left_pad(random_prompts(22, [5, 12, 8]), config.pad_token_id)
  rng = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
  # XLA's default emitters: the suite's elemental ones (tests/compile_level
  # .py) write loops of their own into the compiled text
  hlo = decode_jit.lower(params, jnp.asarray(ids), jnp.asarray(valid), rng,
                         config=config, sampler=sampler).compile(
                             {"xla_cpu_use_fusion_emitters": True}).as_text()
  assert len(re.findall(r"\bwhile\(", hlo)) == 3
  assert "layers_1/" in hlo and "layers_2/" not in hlo  # tiny: 2 layers
  # generate's sampled program (row settings): the same three loops, plus
  # only the rounds of JAX's threefry hash behind its random draws
  from flash_dllm_jax.sampling.row_sampling import GREEDY, RowSampling
  text = decode_jit.lower(
      params, jnp.asarray(ids), jnp.asarray(valid), rng,
      RowSampling.of([GREEDY] * 3, sampler), config=config, sampler=sampler,
      stop_at_eos=True, implementation=None, logprobs=False).as_text()
  funcs = re.split(r"\n\s*func\.func ", text)
  loops = [f.split("(", 1)[0] for f in funcs
           for _ in re.findall(r"stablehlo\.while", f)]
  assert len([f for f in loops if "threefry" not in f]) == 3, loops


def test_without_stop_at_eos_every_position_is_decoded():
  """Positions after a decoded EOS are only dropped when the decode stops at
  EOS; otherwise they are decoded like any other."""
  config, params = tiny("llada", eos_boost=1.2)
  sampler = FlashDLLMSampler(gen_length=24, block_m=4, track_num=2,
                             mask_num=2, rule="fixed", steps=8)
  out = generate(params, random_prompts(43, [5, 9]), config=config,
                 sampler=sampler, stop_at_eos=False)
  assert (out.tokens_BxG == config.eos_token_id).any()  # EOS was decoded
  assert out.steps == 8
  assert not (out.tokens_BxG == config.mask_token_id).any()
