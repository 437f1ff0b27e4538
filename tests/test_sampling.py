"""The reference samplers: semantics, compiled loop, batch invariance."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import decode_jit, decode_tokens, generate
from flash_dllm_jax.prompts import PROMPT_BUCKET, left_pad
from flash_dllm_jax.model import Transformer, init_params
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.architectures.dream.sampler import torch_linspace_f32
from flash_dllm_jax.sampling.row_sampling import RowSampling, row_settings
from tests import reference_samplers


@functools.lru_cache(maxsize=None)
def tiny(arch, eos_boost=0.0):
  """A tiny random model with sharp logits (clear confidence margins).

  eos_boost > 0 makes EOS frequent: its head column becomes (1 + eos_boost/100)
  times the column of the token the model predicts most often.
  """
  config = ModelConfig.tiny(arch)
  params = init_params(config, jax.random.key(7), head_init_scale=8.0)
  if eos_boost:
    x = np.asarray(random_prompts(0, [24] * 4), np.int32)
    x[:, 8:] = config.mask_token_id
    logits = _full_logits(config)(params, jnp.asarray(x))
    common = np.bincount(np.asarray(logits.argmax(-1)).ravel()).argmax()
    head = params["lm_head"]
    params["lm_head"] = head.at[:, config.eos_token_id].set(
        head[:, common] * (1 + eos_boost / 100))
  return config, params


@functools.lru_cache(maxsize=None)
def _full_logits(config):
  """Jitted uncached logits [B, N, V] of every position (one compile per
  shape, where op-by-op dispatch would compile every op)."""
  model = Transformer(config)

  def fn(params, x):
    pos = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape)
    return model.apply({"params": params}, x, pos, jnp.ones(x.shape, bool))[0]

  return jax.jit(fn)


def full_logits_fn(config, params):
  full = _full_logits(config)
  return lambda x: np.asarray(full(params, jnp.asarray(x, jnp.int32)))


def random_prompts(seed, lengths, vocab=300):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).tolist() for n in lengths]


def generate_args(sampler, n_rows: int) -> tuple:
  """decode_jit's positional arguments after the random keys as generate
  passes them for `n_rows` rows of the sampler's own options: lowering with
  these (and generate's keywords) gives generate's program, which then
  loads from the run's compilation cache instead of compiling again."""
  rows = row_settings(sampler, None, n_rows)
  return (None if rows is None else RowSampling.of(rows, sampler),)


def check_compiled_equals_python(arch, sampler, eos_boost, seed, lengths):
  """`decode_jit` and the Python loop give the same arrays, bit for bit, on
  prompts `random_prompts(seed, lengths)` of the tiny `arch` model. Called
  with the arguments `generate` passes (the sampler's row settings
  included): the program is the one generate runs for a batch of as many
  rows in one prompt bucket, compiled once for both."""
  config, params = tiny(arch, eos_boost=eos_boost)
  ids, valid = left_pad(random_prompts(seed, lengths), config.pad_token_id)
  rng_B = jax.vmap(jax.random.key)(jnp.arange(len(lengths), dtype=jnp.uint32))
  rows = row_settings(sampler, None, len(lengths))
  args = (params, jnp.asarray(ids), jnp.asarray(valid), rng_B,
          None if rows is None else RowSampling.of(rows))
  kw = dict(config=config, sampler=sampler, stop_at_eos=True,
            implementation=None, logprobs=False)
  compiled = decode_jit(*args, **kw)
  python = decode_tokens(*args, compiled=False, **kw)
  for a, b in zip(compiled, python):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Neighbour prompt lengths of the batch-independence checks: one bucket.
NEIGHBOURS = [31, 2, 17]


def check_rows_do_not_depend_on_the_batch(arch, sampler, eos_boost, seed,
                                          lengths):
  """Each prompt of `random_prompts(seed, lengths)` decodes to the same
  tokens and forward count alone, in the batch, and at row 1 of a batch of
  as many rows with other neighbours and seeds (each row keeps its own
  seed). The lengths and the neighbours' (NEIGHBOURS) lie in one prompt
  bucket, so every call runs one of two programs (batch and alone): a
  longer neighbour would decode in a group of its own (bucket_groups)
  and only add compilations. Returns the batch's GenerateOutput."""
  config, params = tiny(arch, eos_boost=eos_boost)
  prompts = random_prompts(seed, lengths)
  assert max(lengths) <= PROMPT_BUCKET and len(lengths) <= len(NEIGHBOURS) + 1
  batch = generate(params, prompts, config=config, sampler=sampler, seed=3)
  others = random_prompts(seed + 1, NEIGHBOURS[:len(lengths) - 1])
  seeds = [9, 3] + [11 + j for j in range(len(lengths) - 2)]
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=sampler, seed=3)
    np.testing.assert_array_equal(alone.tokens_BxG[0], batch.tokens_BxG[i])
    assert alone.forwards_B[0] == batch.forwards_B[i]
    mixed = generate(params, [others[0], p, *others[1:]], config=config,
                     sampler=sampler, seed=seeds)
    np.testing.assert_array_equal(mixed.tokens_BxG[1], batch.tokens_BxG[i])
    assert mixed.forwards_B[1] == batch.forwards_B[i]
  return batch


def check_continuous_equals_alone(arch, sampler, eos_boost, lengths):
  """Prompts of `random_prompts(40, lengths)` through two slots in one
  compiled loop: every answer, forward count and step count equals decoding
  that request alone, and refilled slots take fewer loop steps than running
  the requests one after another (at least half as many: 2 slots)."""
  config, params = tiny(arch, eos_boost=eos_boost)
  prompts = random_prompts(40, lengths)
  queued = generate(params, prompts, config=config, sampler=sampler,
                    batch_size=2)
  total_alone = 0
  for i, p in enumerate(prompts):
    alone = generate(params, [p], config=config, sampler=sampler)
    np.testing.assert_array_equal(queued.tokens_BxG[i], alone.tokens_BxG[0])
    assert queued.forwards_B[i] == alone.forwards_B[0]
    assert queued.steps_B[i] == alone.steps_B[0] == alone.steps
    total_alone += alone.steps
  assert total_alone / 2 <= queued.steps < total_alone


LLADA_CASES = [
    dict(gen_length=16, steps=16, block_length=16),
    dict(gen_length=24, steps=12, block_length=8),
    dict(gen_length=16, steps=6, block_length=8),  # uneven per-step counts
    dict(gen_length=16, steps=8, block_length=8, cfg_scale=1.5),
    dict(gen_length=16, steps=8, block_length=16, logits_eos_inf=True,
         confidence_eos_eot_inf=True),
]


@pytest.mark.parametrize("opts", LLADA_CASES)
def test_llada_matches_numpy_restatement(opts):
  config, params = tiny("llada", eos_boost=1.5)
  prompts = random_prompts(1, [7, 7])
  out = generate(params, prompts, config=config, stop_at_eos=False, **opts)
  ref = reference_samplers.llada_generate(
      full_logits_fn(config, params), np.array(prompts),
      mask_id=config.mask_token_id, eos_id=config.eos_token_id,
      eot_id=config.eot_token_id, **opts)
  np.testing.assert_array_equal(out.tokens_BxG, ref[:, 7:])
  assert out.steps == opts["steps"]
  np.testing.assert_array_equal(out.forwards_B,
                                opts["steps"] * (2 if opts.get("cfg_scale") else 1))


@pytest.mark.parametrize("alg,steps", [("maskgit_plus", 8), ("topk_margin", 12),
                                       ("entropy", 16), ("entropy", 5)])
def test_dream_matches_numpy_restatement(alg, steps):
  config, params = tiny("dream")
  prompts = random_prompts(2, [6, 6])
  sampler = DreamSampler(gen_length=16, steps=steps, alg=alg)
  out = generate(params, prompts, config=config, sampler=sampler,
                 stop_at_eos=False)
  ref = reference_samplers.dream_generate(
      full_logits_fn(config, params), np.array(prompts), steps=steps,
      gen_length=16, eps=sampler.eps, alg=alg, mask_id=config.mask_token_id,
      timesteps=sampler.timesteps())
  np.testing.assert_array_equal(out.tokens_BxG, ref[:, 6:])


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.05])
def test_dream_timesteps_match_torch_linspace_bitwise(eps):
  import torch  # here: the mesh scripts import this module's helpers
  for steps in range(1, 1025):
    want = torch.linspace(1, eps, steps + 1, dtype=torch.float32).numpy()
    got = torch_linspace_f32(1, eps, steps + 1)
    np.testing.assert_array_equal(got, want, err_msg=f"steps={steps}")


def test_dream_schedule_examples():
  # reference-semantics.md: 32 tokens over 16 steps -> [1, 2 x 14, 3];
  # over 32 steps -> [0, 1 x 30, 2].
  counts = DreamSampler(gen_length=32, steps=16).transfer_counts()
  assert counts.tolist() == [1] + [2] * 14 + [3]
  counts = DreamSampler(gen_length=32, steps=32).transfer_counts()
  assert counts.tolist() == [0] + [1] * 30 + [2]


def test_llada_schedule_remainder_goes_first():
  counts = LLaDASampler(gen_length=16, steps=6, block_length=8).transfer_counts()
  assert counts.tolist() == [3, 3, 2, 3, 3, 2]


SAMPLERS = [
    ("llada", LLaDASampler(gen_length=16, steps=8, block_length=8)),
    ("llada", LLaDASampler(gen_length=16, steps=16, temperature=0.7,
                           remasking="random", cfg_scale=0.5)),
    ("dream", DreamSampler(gen_length=16, steps=8, alg="entropy")),
    ("dream", DreamSampler(gen_length=16, steps=16, alg="origin",
                           temperature=0.8, top_p=0.9, top_k=50)),
    ("dream", DreamSampler(gen_length=16, steps=8, alg="maskgit_plus",
                           temperature=0.5, alg_temp=0.3)),
]


@pytest.mark.parametrize("arch,sampler", SAMPLERS)
def test_compiled_loop_equals_python_loop(arch, sampler):
  check_compiled_equals_python(arch, sampler, 1.5, 3, [5, 11, 8])


@pytest.mark.parametrize("arch,sampler", SAMPLERS)
def test_rows_do_not_depend_on_the_batch(arch, sampler):
  check_rows_do_not_depend_on_the_batch(arch, sampler, 1.5, 5, [4, 13, 30])
