"""FlashDLLMSampler's default rules equal the reference's loop, restated in
tests/flash_dllm_reference.py: tokens, steps and forwards, verify on and
off, one prompt and a left-padded batch (each row against its oracle run
alone)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax.generate import decode_jit
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests import flash_dllm_reference
from tests.test_sampling import random_prompts, tiny

OPTS = dict(gen_length=24, block_m=4, track_num=2, mask_num=2,
            rank_from_layer=0)  # the tiny model has 2 layers


# Left-padded: each row against its oracle run alone (row 0 is the prompt a
# batch of [9] would hold, so a batch case covers that one-prompt run). The
# sampler is static (one program each); EOS off reuses EOS on's sampler.
BATCH = [9, 14, 11]


@pytest.mark.parametrize("arch,verify,threshold,gamma,eos_boost,tail,lengths", [
    ("llada", False, 0.6, 0.8, 1.2, False, BATCH),
    ("llada", True, 0.9, 0.4, 1.2, False, BATCH),
    ("llada", True, 0.9, 0.4, 0.0, False, BATCH),  # the program above
    ("dream", False, 0.6, 0.8, 1.2, False, BATCH),
    ("dream", True, 0.8, 0.3, 1.2, False, BATCH),
    ("llada", False, 0.6, 0.8, 0.0, True, [9]),
    ("llada", True, 0.8, 0.3, 1.2, True, BATCH)])
def test_compiled_loop_equals_the_reference_loop(arch, verify, threshold,
                                                 gamma, eos_boost, tail,
                                                 lengths):
  """eos_tail: the reference's EOS-filled tail up to its 128-key tiles."""
  config, params = tiny(arch, eos_boost=eos_boost)
  sampler = FlashDLLMSampler(**OPTS, threshold=threshold, verify=verify,
                             gamma=gamma, eos_tail=tail)
  prompts = random_prompts(31, lengths)
  ids, valid = left_pad(prompts, config.pad_token_id)
  rng_B = jax.vmap(jax.random.key)(jnp.arange(len(prompts), dtype=jnp.uint32))
  gen, forwards, _, steps_B = decode_jit(
      params, jnp.asarray(ids), jnp.asarray(valid), rng_B, config=config,
      sampler=sampler)
  ends = 0
  for b, prompt in enumerate(prompts):
    want, steps, fwd = flash_dllm_reference.decode(
        config, params, prompt, **OPTS, threshold=threshold, verify=verify,
        gamma=gamma, budget=sampler.query_budget, eos_tail=tail)
    np.testing.assert_array_equal(np.asarray(gen[b]), np.where(
        want == config.mask_token_id, config.pad_token_id, want))
    assert int(steps_B[b]) == steps and int(forwards[b]) == fwd
    ends += int(np.any(want == config.eos_token_id))
    assert steps < OPTS["gen_length"]  # several commits per step
  if eos_boost and not tail:
    assert ends  # an answer end was fixed and honoured
