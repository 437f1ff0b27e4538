"""Flash-Cache (Flash-dLLM without verification)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.generate import decode_tokens, generate, left_pad
from flash_dllm_jax.sampling.flash_dllm import (FlashCacheAux,
                                                FlashDLLMSampler)
from tests.test_sampling import random_prompts, tiny

UNLIMITED = dict(gen_length=24, block_m=4, track_num=40, mask_num=7,
                 threshold=0.6)


@pytest.mark.parametrize("eos_boost", [0.0, 1.2])
def test_unlimited_budget_equals_full_recomputation(eos_boost):
  """With every position in the query each step, the cache holds nothing
  stale, so the cached run must give exactly the uncached run's tokens."""
  config, params = tiny("llada", eos_boost=eos_boost)
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


def test_compiled_loop_equals_python_loop():
  config, params = tiny("llada", eos_boost=1.2)
  ids, valid = left_pad(random_prompts(22, [5, 12, 8]), config.pad_token_id)
  rng_B = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
  args = (params, jnp.asarray(ids), jnp.asarray(valid), rng_B)
  compiled = jax.jit(decode_tokens, static_argnames=(
      "config", "sampler", "stop_at_eos", "compiled"))(
          *args, config=config, sampler=SMALL)
  python = decode_tokens(*args, config=config, sampler=SMALL, compiled=False)
  for a, b in zip(compiled, python):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rows_do_not_depend_on_the_batch():
  config, params = tiny("llada", eos_boost=1.2)
  prompts = random_prompts(23, [4, 13, 30])
  batch = generate(params, prompts, config=config, sampler=SMALL)
  others = random_prompts(24, [40, 2])
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=SMALL)
    np.testing.assert_array_equal(alone.tokens_BxG[0], batch.tokens_BxG[i])
    assert alone.forwards_B[0] == batch.forwards_B[i]
    mixed = generate(params, [others[0], p, others[1]], config=config,
                     sampler=SMALL)
    np.testing.assert_array_equal(mixed.tokens_BxG[1], batch.tokens_BxG[i])


@pytest.mark.parametrize("eos_boost", [0.0, 1.2])
def test_terminates_with_no_mask_and_one_forward_per_step(eos_boost):
  config, params = tiny("llada", eos_boost=eos_boost)
  out = generate(params, random_prompts(25, [6, 17]), config=config,
                 sampler=SMALL)
  assert not (out.tokens_BxG == config.mask_token_id).any()
  assert out.forwards_B.max() == out.steps <= SMALL.num_steps
  assert (out.forwards_B >= 1).all()


def test_query_selection_follows_the_budget():
  """window = best-ranked open masks, then never-scored ones in order; extra
  masks next; tracked = newly committed first, then by attention mass."""
  sampler = FlashDLLMSampler(gen_length=8, block_m=2, track_num=1,
                             mask_num=2)
  n = 10
  # positions 0-1 prompt, 2-9 generation; 3 and 6 decoded (6 just now)
  open_BxN = jnp.array([[0, 0, 1, 0, 1, 1, 0, 1, 1, 1]], bool)
  others_BxN = ~open_BxN
  rank = jnp.full((1, n), -1.0).at[0, 5].set(0.7).at[0, 8].set(0.2)
  mass = jnp.zeros((1, n)).at[0, 1].set(5.0).at[0, 3].set(1.0)
  new = jnp.zeros((1, n), bool).at[0, 6].set(True)
  aux = FlashCacheAux(cache=None, rank_BxN=rank, mass_BxN=mass, new_BxN=new)
  slots = np.asarray(sampler._select(aux, open_BxN, others_BxN))[0]
  assert slots[:2].tolist() == [5, 8]        # window: best last confidence
  assert slots[2:4].tolist() == [2, 4]       # extra: never scored, in order
  assert slots[4:6].tolist() == [6, 1]       # tracked: new, then most mass


def test_dream_is_refused_clearly():
  config, params = tiny("dream")
  with pytest.raises(ValueError, match="LLaDA-style"):
    generate(params, [1, 2, 3], config=config, sampler=SMALL)


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_m=0), "block_m"), (dict(threshold=0.0), "threshold"),
    (dict(track_num=-1), "track_num"), (dict(mass_from_layer=-2),
                                        "mass_from_layer")])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    FlashDLLMSampler(**kwargs)
