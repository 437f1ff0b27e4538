"""Checks shared by the per-row sampling tests of the reference samplers
(LLaDA, Dream, LLaDA2): a row's own settings decode what the sampler built
with them decodes, alone; and a plain-Python replay of each token's
log-probability at the step that committed it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.generate import generate
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling import DecodeState, make_step
from flash_dllm_jax.sampling.loop import tail_length
from flash_dllm_jax.sampling.row_sampling import RowSampling, Sampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel


def own_options(sampler, s: Sampling) -> dict:
  """The sampler options that state the row settings s."""
  opts = {"temperature": s.temperature}
  if "top_p" in sampler.row_fields:
    opts["top_p"] = None if s.top_p == 1 else s.top_p
    opts["top_k"] = s.top_k or None
  if s.threshold is not None:
    opts["threshold"] = s.threshold
  return opts


def check_rows_equal_own_samplers(model, base, prompts, seeds, rows):
  """generate(sampler=base, sampling=rows) decodes each row as the sampler
  built with that row's settings decodes the row alone (tokens, forwards,
  logprobs); a None row keeps base's own options. Returns the batch's
  GenerateOutput (with logprobs)."""
  got = generate(model, prompts, sampler=base, seed=seeds, sampling=rows,
                 chat=False, logprobs=True)
  for i, s in enumerate(rows):
    own = base if s is None else dataclasses.replace(base,
                                                     **own_options(base, s))
    alone = generate(model, [prompts[i]], sampler=own, seed=seeds[i],
                     chat=False, logprobs=True)
    np.testing.assert_array_equal(got.tokens_BxG[i], alone.tokens_BxG[0])
    assert got.forwards_B[i] == alone.forwards_B[0], i
    np.testing.assert_array_equal(got.logprobs_BxG[i], alone.logprobs_BxG[0])
  return got


def replay_logprobs(model, sampler, prompts, seeds, rows, logits_fn):
  """[B, G] float64: the decode run step by step (the library's step
  function, from Python), and at every position a step commits the
  committed token's log-probability under a NumPy float64 softmax of
  logits_fn(seq_model, tokens before the step) -> [B, N, V]."""
  params, config, _ = model
  ids, valid = left_pad(prompts, config.pad_token_id)
  b, p = ids.shape
  g_all = sampler.gen_length + tail_length(sampler)
  valid_BxN = jnp.concatenate([jnp.asarray(valid),
                               jnp.ones((b, g_all), bool)], 1)
  stop_ids = config.stop_token_ids
  seq = SequenceModel.for_batch(config, params, valid_BxN, None,
                                stop_ids=stop_ids)
  rng_B = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
  state = DecodeState.start(jnp.asarray(ids), g_all, config.mask_token_id,
                            rng_B, RowSampling.of(rows))
  state = state.replace(aux=sampler.init_aux(seq, state.tokens_BxN))
  step = jax.jit(make_step(sampler, seq, p, stop_ids),
                 compiler_options=compiler_options())
  logits = jax.jit(lambda t: logits_fn(seq, t))
  out = np.zeros((b, sampler.gen_length))
  while int(state.step) < sampler.num_steps and not bool(
      np.all(state.done_B)):
    before = np.asarray(state.tokens_BxN)
    l = np.asarray(logits(state.tokens_BxN), np.float64)
    state = step(state)
    after = np.asarray(state.tokens_BxN)
    lsm = l - l.max(-1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
    new = (before == config.mask_token_id) & (after != config.mask_token_id)
    for r, i in zip(*np.nonzero(new[:, p:p + sampler.gen_length])):
      out[r, i] = lsm[r, p + i, after[r, p + i]]
  return out
