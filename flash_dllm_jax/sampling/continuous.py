"""Continuous batching inside the compiled loop.

B slots decode a queue of Q requests. Whenever a slot's answer is complete,
the same loop iteration stores it and loads the next request into the slot,
so the batch stays full until the queue runs dry, with no host round trip.
A sampler's `max_refills` caps the loads per iteration (a slot over the cap
idles one iteration), so a step prefills at most that many new rows.
A request's result never depends on its neighbours, so it equals the result
of decoding it alone. Samplers opt in by being `loop.Refillable`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.sampling.loop import (Refillable, Sampler, make_step,
                                          tail_length)
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import (DecodeState, admit,
                                          fill_after_stop)

EMPTY = -1  # request index of a slot with nothing left to decode


@struct.dataclass
class QueueState:
  """The slots' DecodeState plus queue bookkeeping.

  valid_BxN: key validity of each slot's current request (left padding).
  request_B: which request each slot holds (EMPTY once the queue is dry).
  next_request: the first request not yet loaded.
  gen_UxG, forwards_U, steps_U, logprob_UxG: results of finished requests.
  """

  decode: DecodeState
  valid_BxN: jax.Array
  request_B: jax.Array
  next_request: jax.Array
  gen_UxG: jax.Array
  forwards_U: jax.Array
  steps_U: jax.Array
  logprob_UxG: jax.Array


def _load(state: QueueState, rows_B, requests_B, prompts_UxP, valid_UxP,
          rng_U, sampling_U, mask_id: int, sampler) -> QueueState:
  """Puts requests_B into the slots marked by rows_B (EMPTY: leave idle)."""
  has_B = rows_B & (requests_B != EMPTY)
  idx_B = jnp.maximum(requests_B, 0)
  sampling_B = None if sampling_U is None else jax.tree.map(
      lambda u: u[idx_B], sampling_U)
  decode, valid_BxN = admit(state.decode, state.valid_BxN, has_B,
                            prompts_UxP[idx_B], valid_UxP[idx_B], mask_id,
                            rng_U[idx_B], sampling_B)
  decode = decode.replace(done_B=decode.done_B | (rows_B & ~has_B),
                          aux=sampler.reset_rows(decode.aux, has_B))
  return state.replace(
      decode=decode, valid_BxN=valid_BxN,
      request_B=jnp.where(rows_B, jnp.where(has_B, requests_B, EMPTY),
                          state.request_B))


def decode_queue(params, prompts_UxP: jax.Array, valid_UxP: jax.Array,
                 rng_U: jax.Array, sampling_U=None, *, config: ModelConfig,
                 sampler: Sampler,
                 batch_size: int, stop_at_eos: bool = True,
                 implementation: str | None = None, logprobs: bool = False):
  """Decodes Q requests through batch_size slots in one compiled loop.

  sampling_U: per-request RowSampling (None: greedy). Returns (gen_UxG,
  forwards_U, steps_U, loop_steps[, logprob_UxG with logprobs]). Jit it with
  config, logprobs,
  sampler, batch_size, stop_at_eos and implementation static.
  """
  if not isinstance(sampler, Refillable):
    raise ValueError(f"{type(sampler).__name__} does not support continuous "
                     "batching (it needs reset_rows)")
  q, p = prompts_UxP.shape
  b, g, mask_id = batch_size, sampler.gen_length, config.mask_token_id
  g_all = g + tail_length(sampler)  # positions after the prompt
  stop_ids = config.stop_token_ids if stop_at_eos else ()
  start = DecodeState.start(jnp.zeros((b, p), prompts_UxP.dtype), g_all,
                            mask_id,
                            rng_U[jnp.zeros((b,), jnp.int32)],
                            None if sampling_U is None else jax.tree.map(
                                lambda u: u[jnp.zeros((b,), jnp.int32)],
                                sampling_U))
  placeholder = SequenceModel.for_batch(
      config, params, jnp.ones((b, p + g_all), bool), implementation)
  start = start.replace(aux=sampler.init_aux(placeholder, start.tokens_BxN))
  first_B = jnp.where(jnp.arange(b) < q, jnp.arange(b), EMPTY)
  state = QueueState(
      decode=start, valid_BxN=jnp.ones((b, p + g_all), bool),
      request_B=jnp.full((b,), EMPTY), next_request=jnp.minimum(b, q),
      gen_UxG=jnp.full((q, g), mask_id, prompts_UxP.dtype),
      forwards_U=jnp.zeros((q,), jnp.int32), steps_U=jnp.zeros((q,), jnp.int32),
      logprob_UxG=jnp.zeros((q, g), jnp.float32))
  state = _load(state, jnp.ones((b,), bool), first_B, prompts_UxP, valid_UxP,
                rng_U, sampling_U, mask_id, sampler)

  def body(state: QueueState) -> QueueState:
    model = SequenceModel.for_batch(config, params, state.valid_BxN,
                                    implementation, stop_ids)
    decode = make_step(sampler, model, p, stop_ids)(state.decode)
    finished_B = decode.done_B & (state.request_B != EMPTY)
    slot_U = jnp.where(finished_B, state.request_B, q)
    gen_BxG = fill_after_stop(decode.tokens_BxN[:, p:p + g], mask_id,
                              config.pad_token_id)
    state = state.replace(
        decode=decode,
        gen_UxG=state.gen_UxG.at[slot_U].set(gen_BxG, mode="drop"),
        logprob_UxG=state.logprob_UxG.at[slot_U].set(
            decode.logprob_BxN[:, p:p + g], mode="drop"),
        forwards_U=state.forwards_U.at[slot_U].set(decode.forwards_B,
                                                   mode="drop"),
        steps_U=state.steps_U.at[slot_U].set(decode.steps_B, mode="drop"))
    # Free: just finished, or left idle by the refill cap (or a dry queue).
    free_B = finished_B | (state.request_B == EMPTY)
    order_B = jnp.cumsum(free_B) - 1
    wanted_B = state.next_request + order_B
    load_B = free_B & (order_B < refills) & (wanted_B < q)
    requests_B = jnp.where(load_B, wanted_B, EMPTY)
    state = _load(state, free_B, requests_B, prompts_UxP, valid_UxP,
                  rng_U, sampling_U, mask_id, sampler)
    return state.replace(next_request=state.next_request + load_B.sum())

  refills = sampler.max_refills or b
  max_steps = q * sampler.num_steps
  state = jax.lax.while_loop(
      lambda s: ((jnp.any(s.request_B != EMPTY) | (s.next_request < q))
                 & (s.decode.step < max_steps)),
      body, state)
  out = state.gen_UxG, state.forwards_U, state.steps_U, state.decode.step
  return (*out, state.logprob_UxG) if logprobs else out
