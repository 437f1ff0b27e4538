"""Continuous batching inside the compiled loop.

B slots decode a queue of Q requests. Whenever a slot's answer is complete,
the same loop iteration stores it and loads the next request into the slot,
so the batch stays full until the queue runs dry, with no host round trip.
A sampler's `max_refills` caps the loads per iteration (a slot over the cap
idles one iteration), so a step prefills at most that many new rows
(slots.refill_cap); rows enter and leave slots through slots.py only.
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
from flash_dllm_jax.sampling import slots
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.slots import SlotState
from flash_dllm_jax.sampling.state import fill_after_stop

EMPTY = slots.EMPTY  # request index of a slot with nothing left to decode


@struct.dataclass
class QueueState:
  """The slots plus queue bookkeeping.

  slots: the slots' SlotState (slots.py).
  request_B: which request each slot holds (EMPTY once the queue is dry).
  next_request: the first request not yet loaded.
  gen_UxG, forwards_U, steps_U, logprob_UxG: results of finished requests.
  """

  slots: SlotState
  request_B: jax.Array
  next_request: jax.Array
  gen_UxG: jax.Array
  forwards_U: jax.Array
  steps_U: jax.Array
  logprob_UxG: jax.Array


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
  model_for = lambda valid_BxN: SequenceModel.for_batch(
      config, params, valid_BxN, implementation, stop_ids)
  admission = dict(sampler=sampler, mask_id=mask_id, model_for=model_for)
  first_B = jnp.zeros((b,), jnp.int32)  # placeholders until loaded
  empty = slots.start(sampler, model_for, jnp.zeros((b, p), prompts_UxP.dtype),
                      jnp.ones((b, p), bool), g_all, mask_id, rng_U[first_B],
                      None if sampling_U is None else jax.tree.map(
                          lambda u: u[first_B], sampling_U), done=True)
  state = QueueState(
      slots=empty, request_B=jnp.full((b,), EMPTY),
      next_request=jnp.zeros((), jnp.int32),
      gen_UxG=jnp.full((q, g), mask_id, prompts_UxP.dtype),
      forwards_U=jnp.zeros((q,), jnp.int32), steps_U=jnp.zeros((q,), jnp.int32),
      logprob_UxG=jnp.zeros((q, g), jnp.float32))
  refills = slots.refill_cap(sampler, b)

  def refill(state: QueueState, free_B, cap: int) -> QueueState:
    """The refill rule (slots.refill) over the free slots."""
    held, requests_B = slots.refill(
        state.slots, free_B, cap, state.next_request, q, prompts_UxP,
        valid_UxP, rng_U, sampling_U, **admission)
    return state.replace(
        slots=held, next_request=state.next_request + jnp.sum(
            requests_B != EMPTY),
        request_B=jnp.where(free_B, requests_B, state.request_B))

  def body(state: QueueState) -> QueueState:
    held = state.slots
    decode = make_step(sampler, model_for(held.valid_BxN), p,
                       stop_ids)(held.decode)
    finished_B = decode.done_B & (state.request_B != EMPTY)
    slot_U = jnp.where(finished_B, state.request_B, q)
    gen_BxG = fill_after_stop(decode.tokens_BxN[:, p:p + g], mask_id,
                              config.pad_token_id)
    state = state.replace(
        slots=held.replace(decode=decode),
        gen_UxG=state.gen_UxG.at[slot_U].set(gen_BxG, mode="drop"),
        logprob_UxG=state.logprob_UxG.at[slot_U].set(
            decode.logprob_BxN[:, p:p + g], mode="drop"),
        forwards_U=state.forwards_U.at[slot_U].set(decode.forwards_B,
                                                   mode="drop"),
        steps_U=state.steps_U.at[slot_U].set(decode.steps_B, mode="drop"))
    # Free: just finished, or left idle by the refill cap (or a dry queue).
    return refill(state, finished_B | (state.request_B == EMPTY), refills)

  state = refill(state, jnp.ones((b,), bool), b)  # the first b at once
  max_steps = q * sampler.num_steps
  state = jax.lax.while_loop(
      lambda s: ((jnp.any(s.request_B != EMPTY) | (s.next_request < q))
                 & (s.slots.decode.step < max_steps)),
      body, state)
  out = (state.gen_UxG, state.forwards_U, state.steps_U,
         state.slots.decode.step)
  return (*out, state.logprob_UxG) if logprobs else out
