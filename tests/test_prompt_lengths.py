"""Prompt lengths against the model's context: bucket padding never makes a
fitting prompt fail, and a refusal names every offending prompt."""

import numpy as np
import pytest

from flash_dllm_jax import generate, load
from flash_dllm_jax.prompts import bucket_groups, left_pad, padded_length
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from tests.paths import TINY_CHECKPOINT


def test_padding_is_capped_at_the_room_left_for_the_prompt():
  assert padded_length(470, 32) == 480
  assert padded_length(470, 32, room=472) == 472
  assert padded_length(10, 32, room=472) == 32
  assert padded_length(472, 32, room=472) == 472
  assert padded_length(480, 32, room=472) == 480  # does not fit anyway
  ids, valid = left_pad([[1] * 470, [2] * 3], pad_id=0, room=472)
  assert ids.shape == (2, 472) and valid.sum(1).tolist() == [470, 3]
  groups = bucket_groups([[1] * 470, [2] * 3, [3] * 471], room=472)
  assert [g.tolist() for g in groups] == [[0, 2], [1]]


def test_a_fitting_prompt_whose_bucket_does_not_fit_decodes():
  """512-token model: 470 + 40 fits, though 470 pads to 480."""
  params, config, _ = load(TINY_CHECKPOINT)
  assert config.max_seq_len == 512
  sampler = LLaDASampler(gen_length=40, steps=8)
  rng = np.random.default_rng(0)
  out = generate(params, rng.integers(0, 300, 470).tolist(), config=config,
                 sampler=sampler, stop_at_eos=False)
  assert out.tokens_BxG.shape == (1, 40) and out.steps == 8
  assert not (out.tokens_BxG == config.mask_token_id).any()


def test_every_prompt_that_does_not_fit_is_named():
  params, config, _ = load(TINY_CHECKPOINT)
  prompts = [[1] * n for n in (470, 10, 500, 473)]
  with pytest.raises(ValueError) as e:
    generate(params, prompts, config=config, gen_length=40, steps=8)
  message = str(e.value)
  assert message.startswith("2 of 4 prompt(s) do not fit: ")
  assert "prompt 2 (500 tokens)" in message
  assert "prompt 3 (473 tokens)" in message
  assert "prompt 0 " not in message and "prompt 1 " not in message
  assert "exceeds max_seq_len 512" in message
