"""One padded batch through the compiled decode loop: `decode_tokens` (the
decode as a pure function of device arrays), its batch-invariant jits, and
`decode_rows` (host rows in, host arrays out), which `generate` calls per
prompt-length bucket."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import ops, parallel
from flash_dllm_jax.compilation import _BatchInvariantJit
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import left_pad
from flash_dllm_jax.sampling import Sampler, make_step, run_compiled, run_python
from flash_dllm_jax.sampling import continuous, slots
from flash_dllm_jax.sampling.loop import tail_length
from flash_dllm_jax.sampling.row_sampling import RowSampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import fill_after_stop


def decode_rows(params, rows, seeds, sampling, *, config: ModelConfig,
                 sampler: Sampler, stop_at_eos: bool, batch_size: int | None,
                 mesh, kernels: ops.Kernels | None = None,
                 logprobs: bool = False):
  """(gen_BxG, forwards_B, steps_B, loop steps, logprob_BxG or None) of one
  padded batch, through
  continuous batching when batch_size < len(rows), over the mesh if any."""
  ids, valid = left_pad(rows, config.pad_token_id,
                        room=config.max_seq_len - sampler.gen_length
                        - tail_length(sampler))
  n_rows = len(rows)
  if mesh is not None:
    if batch_size is not None and batch_size < n_rows:
      raise ValueError("mesh= and continuous batching (batch_size=) cannot be "
                       "combined yet")
    pad = -n_rows % parallel.data_size(mesh)
    ids, valid = (np.concatenate([a, np.repeat(a[-1:], pad, 0)])
                  for a in (ids, valid))
    seeds = list(seeds) + [seeds[-1]] * pad
    if sampling is not None:
      sampling = list(sampling) + [sampling[-1]] * pad
  rng_B = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
  if sampling is not None:
    sampling = RowSampling.of(sampling, sampler)
  ids, valid = jnp.asarray(ids), jnp.asarray(valid)
  if mesh is not None:
    ids, valid, rng_B = (parallel.shard_rows(mesh, a)
                         for a in (ids, valid, rng_B))
    sampling = jax.tree.map(lambda a: parallel.shard_rows(mesh, a), sampling)
  if batch_size is not None and batch_size < n_rows:
    gen, forwards, steps_b, steps, *lp = _queue_jit(
        params, ids, valid, rng_B, sampling, config=config,
        sampler=sampler, batch_size=batch_size, stop_at_eos=stop_at_eos,
        implementation=kernels, logprobs=logprobs)
  else:
    with parallel.use(mesh):
      gen, forwards, steps, steps_b, *lp = decode_jit(
          params, ids, valid, rng_B, sampling, config=config, sampler=sampler,
          stop_at_eos=stop_at_eos, implementation=kernels, logprobs=logprobs)
  gen, forwards, steps_b = (np.asarray(a)[:n_rows]
                            for a in (gen, forwards, steps_b))
  lp = np.asarray(lp[0])[:n_rows] if lp else None
  return gen, forwards, steps_b, int(steps), lp


def decode_tokens(params, prompt_BxP: jax.Array, valid_BxP: jax.Array,
                  rng_B: jax.Array, sampling: RowSampling | None = None, *,
                  config: ModelConfig, sampler: Sampler,
                  stop_at_eos: bool = True, compiled: bool = True,
                  implementation: str | None = None, logprobs: bool = False):
  """The decode as a pure function of device arrays (jit it with config,
  sampler, stop_at_eos, compiled and implementation static; under a mesh,
  trace it inside `parallel.use(mesh)`). Returns (gen_BxG, forwards_B,
  steps, steps_B[, logprob_BxG with logprobs]). sampling: per-row settings
  (None: greedy);
  implementation: kernel choice (flash_dllm_jax/ops/)."""
  p, g = prompt_BxP.shape[1], sampler.gen_length
  stop_ids = config.stop_token_ids if stop_at_eos else ()
  model_for = lambda valid_BxN: SequenceModel.for_batch(
      config, params, valid_BxN, implementation, stop_ids=stop_ids)
  held = slots.start(sampler, model_for, prompt_BxP, valid_BxP,
                     g + tail_length(sampler), config.mask_token_id, rng_B,
                     sampling)
  step_fn = make_step(sampler, model_for(held.valid_BxN), p, stop_ids)
  state = held.decode
  run = run_compiled if compiled else run_python
  state = run(step_fn, state, sampler.num_steps)
  gen_BxG = fill_after_stop(state.tokens_BxN[:, p:p + g],
                            config.mask_token_id, config.pad_token_id)
  out = gen_BxG, state.forwards_B, state.step, state.steps_B
  return (*out, state.logprob_BxN[:, p:p + g]) if logprobs else out


decode_jit = _BatchInvariantJit(decode_tokens, static_argnames=(
    "config", "sampler", "stop_at_eos", "compiled", "implementation",
    "logprobs"))
_queue_jit = _BatchInvariantJit(continuous.decode_queue, static_argnames=(
    "config", "sampler", "batch_size", "stop_at_eos", "implementation",
    "logprobs"))
