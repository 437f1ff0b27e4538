"""Fast-dLLM: cache exactness, NumPy restatement, batching (its commit rules:
test_commit_rules.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.model import KVCache, Transformer
from flash_dllm_jax.sampling import FastDLLMSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from tests import fast_dllm_reference as ref
from tests.test_sampling import (NEIGHBOURS, check_compiled_equals_python,
                                 random_prompts, tiny)


def _gen(arch, sampler, prompts, stop_at_eos=False, **kw):
  config, params = tiny(arch, eos_boost=1.5)
  return generate(params, prompts, config=config, sampler=sampler,
                  stop_at_eos=stop_at_eos, **kw)


@pytest.mark.parametrize("arch,rule", [("llada", "threshold"),
                                       ("dream", "factor")])
def test_refresh_every_step_equals_no_cache(arch, rule):
  """(The uncached samplers are RESTATED's: their programs run there.)"""
  prompts = random_prompts(1, [7, 12])
  opts = dict(gen_length=32, block_length=8, rule=rule, threshold=0.7,
              **({"factor": 0.5} if rule == "factor" else {}))
  none = _gen(arch, FastDLLMSampler(cache="none", **opts), prompts)
  for cache in ("prefix", "dual"):
    out = _gen(arch, FastDLLMSampler(cache=cache, refresh_every=1, **opts),
               prompts)
    np.testing.assert_array_equal(out.tokens_BxG, none.tokens_BxG)
    np.testing.assert_array_equal(out.forwards_B, none.forwards_B)
    assert out.steps == none.steps


def test_fixed_rule_without_cache_is_llada():
  prompts = random_prompts(2, [5, 9, 14])
  for steps, block in [(32, 8), (12, 8)]:
    fast = _gen("llada", FastDLLMSampler(gen_length=32, block_length=block,
                                         steps=steps, cache="none",
                                         rule="fixed"), prompts)
    llada = _gen("llada", LLaDASampler(gen_length=32, steps=steps,
                                       block_length=block), prompts)
    np.testing.assert_array_equal(fast.tokens_BxG, llada.tokens_BxG)
    np.testing.assert_array_equal(fast.forwards_B, llada.forwards_B)


@functools.lru_cache(maxsize=None)
def _callbacks(arch, n):
  """Batch-1 full and cached forwards for the NumPy restatement."""
  config, params = tiny(arch, eos_boost=1.5)
  model = Transformer(config)
  valid = jnp.ones((1, n), bool)

  @jax.jit
  def full(x):
    slots = jnp.arange(n)[None]
    kv = KVCache.zeros(config, 1, n)
    return model.apply({"params": params}, x[None], slots, valid, cache=kv,
                       slots_BxQ=slots)

  @jax.jit
  def cached(x, slots, kv):
    return model.apply({"params": params}, x[None], slots[None], valid,
                       cache=kv, slots_BxQ=slots[None])

  def host(fn):
    def call(x, *rest):  # rest: (slots, kv) for the cached forward
      logits, kv = fn(jnp.asarray(x), *rest)
      return np.asarray(logits[0]), kv
    return call

  return host(full), host(cached)


# The uncached ones are test_refresh_every_step_equals_no_cache's samplers
# (one program each; the factor rule ignores the threshold).
RESTATED = [("llada", "dual", dict(threshold=0.9)),
            ("llada", "prefix", dict(threshold=0.7)),
            ("llada", "none", dict(threshold=0.7)),
            ("llada", "dual", dict(factor=1.0)),
            ("dream", "dual", dict(threshold=0.7)),
            ("dream", "prefix", dict(threshold=0.9)),
            ("dream", "none", dict(factor=0.5, threshold=0.7))]


@pytest.mark.parametrize("arch,cache,rule", RESTATED)
def test_matches_numpy_restatement(arch, cache, rule):
  config, params = tiny(arch, eos_boost=1.5)
  prompts = random_prompts(3, [9, 9])
  opts = dict(gen_length=32, block_length=8, cache=cache)
  sampler = FastDLLMSampler(
      rule="factor" if "factor" in rule else "threshold", **opts, **rule)
  out = _gen(arch, sampler, prompts)
  for b, prompt in enumerate(prompts):
    full, cached = _callbacks(arch, len(prompt) + 32)
    x, nfe, quirks = ref.fast_dllm_generate(
        full, cached, prompt, mask_id=config.mask_token_id,
        shift=config.logits_shift, **opts, **rule)
    np.testing.assert_array_equal(out.tokens_BxG[b], x[len(prompt):])
    # The reference's cached call after the final block finished at its
    # block-start step is not made here: the row is already complete.
    assert out.forwards_B[b] == nfe - quirks[-1]


def test_quirk_costs_one_cached_call_per_block_done_at_start():
  config, params = tiny("llada", eos_boost=1.5)
  prompt = random_prompts(5, [9])[0]
  opts = dict(gen_length=32, block_length=4, threshold=0.5)
  full, cached = _callbacks("llada", len(prompt) + 32)
  _, nfe_none, _ = ref.fast_dllm_generate(
      full, cached, prompt, cache="none", mask_id=config.mask_token_id, **opts)
  x, nfe, quirks = ref.fast_dllm_generate(
      full, cached, prompt, cache="dual", mask_id=config.mask_token_id, **opts)
  assert sum(quirks[:-1]) >= 2 and quirks[-1], "too few blocks done at start"
  out = _gen("llada", FastDLLMSampler(cache="dual", **opts), [prompt])
  np.testing.assert_array_equal(out.tokens_BxG[0], x[len(prompt):])
  assert out.forwards_B[0] == nfe - quirks[-1]
  none = _gen("llada", FastDLLMSampler(cache="none", **opts), [prompt])
  assert none.forwards_B[0] == nfe_none == none.steps


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_cached_rows_line_up_with_the_full_forward(arch):
  """With a fresh cache, a cached step's block logits equal the full
  forward's (Dream: the first block position is read from the previous
  position, which the cached step recomputes)."""
  config, params = tiny(arch)
  ids, valid = left_pad(random_prompts(7, [5, 11]), config.pad_token_id)
  b, p = ids.shape
  gen = np.asarray(random_prompts(8, [16, 16]))
  gen[:, 9:] = config.mask_token_id
  tokens = jnp.asarray(np.concatenate([ids, gen], 1), jnp.int32)
  model = SequenceModel.for_batch(
      config, params, jnp.asarray(np.concatenate([valid, gen > -1], 1)))
  start_B = jnp.full((b,), p + 8)
  rows = start_B[:, None] - config.logits_shift + jnp.arange(8)
  want = jax.jit(model.logits)(tokens, rows)
  for cache in ("prefix", "dual"):
    sampler = FastDLLMSampler(gen_length=16, block_length=8, cache=cache)
    block_logits = jax.jit(lambda aux: sampler.block_logits(
        model, tokens, aux, start_B, jnp.ones((b,), bool)))
    aux = sampler.init_aux(model, tokens)
    got_full, filled = block_logits(aux)  # age 0: the full forward
    got_cached, _ = block_logits(aux.replace(age_B=aux.age_B + 1,
                                             cache=filled))
    np.testing.assert_allclose(np.asarray(got_full), np.asarray(want),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_cached), np.asarray(want),
                               rtol=1e-5, atol=1e-4)


# Each cache once, both architectures, both commit rules.
INVARIANCE = [("llada", dict(cache="none")),
              ("llada", dict(cache="prefix", rule="factor", refresh_every=2)),
              ("dream", dict(cache="dual", refresh_every=3))]


@pytest.mark.parametrize("arch,opts", INVARIANCE)
def test_rows_do_not_depend_on_the_batch(arch, opts):
  sampler = FastDLLMSampler(gen_length=32, block_length=8, **opts)
  prompts = random_prompts(5, [4, 13, 9, 30])
  batch = _gen(arch, sampler, prompts, stop_at_eos=True)
  # Other neighbours in the same prompt bucket: the batch's program.
  others = random_prompts(6, NEIGHBOURS)
  for i, prompt in enumerate(prompts):
    alone = _gen(arch, sampler, [prompt], stop_at_eos=True)
    mixed = _gen(arch, sampler, [others[0], prompt, *others[1:]],
                 stop_at_eos=True)
    for out, row in ((alone, 0), (mixed, 1)):
      np.testing.assert_array_equal(out.tokens_BxG[row], batch.tokens_BxG[i])
      assert out.forwards_B[row] == batch.forwards_B[i]
    assert alone.forwards_B[0] == alone.steps  # one forward per step run
  assert len(set(batch.forwards_B.tolist())) > 1  # rows ran at own speeds


def test_compiled_loop_equals_python_loop():
  check_compiled_equals_python("dream", FastDLLMSampler(
      gen_length=8, block_length=4, cache="prefix", rule="factor",
      refresh_every=2), 1.5, 3, [5, 11, 8])


@pytest.mark.parametrize("arch,opts", [INVARIANCE[0], INVARIANCE[2]])
def test_rows_end_without_masks_and_stop_early(arch, opts):
  """The stopping decode is test_rows_do_not_depend_on_the_batch's batch
  (its program runs); decoding on past EOS changes no answer."""
  config, _ = tiny(arch)
  sampler = FastDLLMSampler(gen_length=32, block_length=8, **opts)
  prompts = random_prompts(5, [4, 13, 9, 30])
  full = _gen(arch, sampler, prompts, stop_at_eos=False)
  early = _gen(arch, sampler, prompts, stop_at_eos=True)
  assert not (full.tokens_BxG == config.mask_token_id).any()
  assert full.steps <= sampler.num_steps
  for b in range(len(prompts)):
    answer = answer_ids(full.tokens_BxG[b], config)
    assert answer_ids(early.tokens_BxG[b], config) == answer
  assert (early.forwards_B <= full.forwards_B).all()
  assert (early.forwards_B < full.forwards_B).any(), "no row stopped early"


@pytest.mark.parametrize("kwargs,message", [
    (dict(cache="paged"), "cache must be one of"),
    (dict(rule="greedy"), "rule must be one of"),
    (dict(threshold=0.0), "threshold must be in"),
    (dict(threshold=1.5), "threshold must be in"),
    (dict(factor=0.0), "factor must be > 0"),
    (dict(gen_length=30, block_length=8), "multiple of block_length"),
    (dict(gen_length=32, block_length=8, steps=6), "multiple of the number"),
    (dict(block_length=0), "block_length must be a positive int"),
    (dict(refresh_every=0), "refresh_every must be None or a positive int"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    FastDLLMSampler(**kwargs)


def test_prompt_too_long_for_the_model():
  config, params = tiny("llada")
  with pytest.raises(ValueError, match="exceeds max_seq_len"):
    generate(params, [1] * 490, config=config,
             sampler=FastDLLMSampler(gen_length=32, block_length=8))
