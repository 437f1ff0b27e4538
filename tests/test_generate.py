"""generate(): early stopping, termination, input handling and errors."""

import re

import numpy as np
import pytest

from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from tests.test_sampling import random_prompts, tiny

STOPPING = [
    ("llada", dict(gen_length=32, steps=32, block_length=8)),
    ("llada", dict(gen_length=32, steps=16, block_length=32)),
    ("dream", dict(gen_length=32, steps=16, alg="entropy")),
    ("dream", dict(gen_length=32, steps=32, alg="maskgit_plus")),
]


@pytest.mark.parametrize("arch,opts", STOPPING)
def test_early_stop_keeps_the_answer(arch, opts):
  config, params = tiny(arch, eos_boost=1.5)  # EOS is common: rows stop early
  prompts = random_prompts(11, [3, 9, 17, 6, 12, 5])
  full = generate(params, prompts, config=config, stop_at_eos=False, **opts)
  early = generate(params, prompts, config=config, stop_at_eos=True, **opts)
  stopped_early = 0
  for b in range(len(prompts)):
    answer = answer_ids(full.tokens_BxG[b], config)
    n = len(answer)
    assert answer_ids(early.tokens_BxG[b], config) == answer
    if n < opts["gen_length"]:  # the stop token itself
      assert early.tokens_BxG[b, n] == full.tokens_BxG[b, n]
    assert early.forwards_B[b] <= full.forwards_B[b]
    assert early.steps_B[b] <= early.steps == early.steps_B.max()
    stopped_early += early.forwards_B[b] < full.forwards_B[b]
  assert stopped_early > 0, "the test model never stopped early"
  assert early.steps <= full.steps


@pytest.mark.parametrize("arch,opts", STOPPING)
def test_every_row_ends_without_masks(arch, opts):
  """Six prompts: the batch shape of the early-stop test above, whose
  program runs."""
  config, params = tiny(arch, eos_boost=1.5)
  out = generate(params, random_prompts(12, [4, 20, 8, 15, 2, 11]),
                 config=config, **opts)
  assert not (out.tokens_BxG == config.mask_token_id).any()
  assert out.tokens_BxG.shape == (6, opts["gen_length"])


def test_left_pad_buckets_and_marks_valid():
  ids, valid = left_pad([[5, 6], [7, 8, 9]], pad_id=0, bucket=4)
  assert ids.tolist() == [[0, 0, 5, 6], [0, 7, 8, 9]]
  assert valid.tolist() == [[False, False, True, True], [False, True, True, True]]


def test_token_id_prompt_forms_agree():
  config, params = tiny("llada")
  opts = dict(gen_length=8, steps=4)
  a = generate(params, [3, 4, 5], config=config, **opts)
  b = generate(params, [[3, 4, 5]], config=config, **opts)
  c = generate(params, np.array([[3, 4, 5]]), config=config, **opts)
  np.testing.assert_array_equal(a.tokens_BxG, b.tokens_BxG)
  np.testing.assert_array_equal(a.tokens_BxG, c.tokens_BxG)
  assert a.texts is None  # no tokenizer given


@pytest.mark.parametrize("kwargs,message", [
    (dict(gen_length=10, block_length=4), "multiple of block_length"),
    (dict(gen_length=8, steps=3, block_length=4), "multiple of the number"),
    (dict(remasking="lowest"), "remasking"),
    (dict(temperature=-1.0), "temperature"),
    (dict(steps=0), "steps must be a positive int"),
    (dict(topp=0.9), "unknown option"),
])
def test_llada_bad_arguments(kwargs, message):
  config, params = tiny("llada")
  with pytest.raises(ValueError, match=message):
    generate(params, [1, 2], config=config, **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(alg="greedy"), "alg must be one of"),
    (dict(eps=0.0), "eps"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(alg_temp=-0.1), "alg_temp"),
])
def test_dream_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    DreamSampler(**kwargs)


@pytest.mark.parametrize("prompt,message", [
    ([], "prompt must be"),
    ([[1, 2], []], "at least one token"),
    ([1, 383], "mask token"),
    ([1, 10_000], "outside"),
    ("hello", "need a tokenizer"),
])
def test_bad_prompts(prompt, message):
  config, params = tiny("llada")
  with pytest.raises((ValueError, TypeError), match=message):
    generate(params, prompt, config=config, gen_length=8, steps=8)


def test_too_long_for_the_model():
  config, params = tiny("llada")
  with pytest.raises(ValueError, match="max_seq_len"):
    generate(params, [1, 2], config=config, gen_length=1024, steps=1024)


def test_seed_count_must_match():
  config, params = tiny("dream")
  with pytest.raises(ValueError, match="seeds"):
    generate(params, [[1], [2]], config=config, seed=[1, 2, 3],
             sampler=DreamSampler(gen_length=8, steps=8))
  # Seeds are uint32 PRNG keys: others are refused before any decode.
  for seed, shown in ((-1, "-1"), ([0, 2 ** 32], "4294967296 (row 1)"),
                      (1.5, "1.5")):
    with pytest.raises(ValueError, match=r"^seed must be an int in \[0, "
                       rf"2\*\*32\), got {re.escape(shown)}$"):
      generate(params, [[1], [2]], config=config, seed=seed,
               sampler=DreamSampler(gen_length=8, steps=8))


def test_sampler_and_options_are_exclusive():
  config, params = tiny("llada")
  with pytest.raises(ValueError, match="together with sampler"):
    generate(params, [1], config=config, sampler=LLaDASampler(8, 8), steps=4)


def test_bucket_groups_split_rows_by_their_own_padded_length():
  from flash_dllm_jax.prompts import bucket_groups
  rows = [[1] * n for n in (5, 40, 32, 33, 64, 1)]
  groups = bucket_groups(rows, bucket=32)
  assert [g.tolist() for g in groups] == [[1, 3, 4], [0, 2, 5]]
