"""Slots: the rows of a compiled decode, and the one way a request enters one.

Offline static batches (`generate.decode_tokens`), offline continuous
batching (`continuous.decode_queue`) and the server's slots
(`serve/model_runner.py`) all build their state with `start`, load rows
with `admit` (the row's prompt, key, settings and the sampler's aux reset)
and free them with `release`; `refill_cap` and `take` are the refill rule
(which free slots take which waiting requests), and `refill` applies it to
a device-side queue inside a compiled loop (offline continuous batching and
the server's calls).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling.loop import Refillable
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState, where_keys
from flash_dllm_jax.sampling.top_logprobs import TopLogprobs

EMPTY = -1  # a slot's queue entry where it loaded none

# valid_BxN -> the model a decode with that padding runs (params, kernels
# and stop ids fixed by the caller)
ModelFor = Callable[[jax.Array], SequenceModel]


@struct.dataclass
class SlotState:
  """decode: the rows' DecodeState (an empty slot is a done row);
  valid_BxN: key validity of each row (its own left padding)."""

  decode: DecodeState
  valid_BxN: jax.Array


def _row(prompt_BxP, valid_BxP, positions: int, mask_id: int):
  """(tokens_BxN, valid_BxN): the prompt then `positions` masks."""
  b = prompt_BxP.shape[0]
  tokens_BxN = jnp.concatenate(
      [prompt_BxP, jnp.full((b, positions), mask_id, prompt_BxP.dtype)],
      axis=1)
  return tokens_BxN, jnp.concatenate(
      [valid_BxP, jnp.ones((b, positions), bool)], axis=1)


def start(sampler, model_for: ModelFor, prompt_BxP: jax.Array,
          valid_BxP: jax.Array, positions: int, mask_id: int,
          rng_B: jax.Array, sampling=None, done: bool = False,
          top_k: int = 0) -> SlotState:
  """Rows holding prompt_BxP then `positions` masks, running (done=False:
  a static batch) or empty (done=True: slots that `admit` fills), with the
  sampler's initial aux for them; top_k > 0: with a buffer for each
  written token's top_k alternatives (top_logprobs.py)."""
  decode = DecodeState.start(prompt_BxP, positions, mask_id, rng_B, sampling)
  _, valid_BxN = _row(prompt_BxP, valid_BxP, positions, mask_id)
  decode = decode.replace(
      done_B=jnp.full(decode.done_B.shape, done),
      aux=sampler.init_aux(model_for(valid_BxN), decode.tokens_BxN),
      top=TopLogprobs.zeros(*decode.tokens_BxN.shape, top_k) if top_k
      else None)
  return SlotState(decode=decode, valid_BxN=valid_BxN)


def admit(state: SlotState, load_B: jax.Array, prompt_BxP: jax.Array,
          valid_BxP: jax.Array, rng_B: jax.Array, sampling, *, sampler,
          mask_id: int, model_for: ModelFor) -> SlotState:
  """`state` with rows load_B [B] starting a new request: its prompt then
  masks, its valid positions, counters at 0, running, its own key and
  RowSampling (None: keep the state's); other rows unchanged.

  The aux: a Refillable sampler forgets the loaded rows (`reset_rows`);
  any other keeps one schedule for the batch, so loading restarts it (step
  0, a fresh `init_aux`) and is only done when every slot is free."""
  d, g = state.decode, state.valid_BxN.shape[1] - prompt_BxP.shape[1]
  tokens_BxN, new_valid_BxN = _row(prompt_BxP, valid_BxP, g, mask_id)
  valid_BxN = jnp.where(load_B[:, None], new_valid_BxN, state.valid_BxN)
  d = d.replace(
      tokens_BxN=jnp.where(load_B[:, None], tokens_BxN, d.tokens_BxN),
      done_B=d.done_B & ~load_B,
      forwards_B=jnp.where(load_B, 0, d.forwards_B),
      steps_B=jnp.where(load_B, 0, d.steps_B),
      rng_B=where_keys(load_B, rng_B, d.rng_B),
      sampling=d.sampling if sampling is None else sampling.where(
          load_B, d.sampling))
  if isinstance(sampler, Refillable):
    d = d.replace(aux=sampler.reset_rows(d.aux, load_B))
  else:
    fresh = sampler.init_aux(model_for(valid_BxN), d.tokens_BxN)
    loading = jnp.any(load_B)
    d = d.replace(step=jnp.where(loading, 0, d.step),
                  aux=jax.tree.map(lambda a, c: jnp.where(loading, a, c),
                                   fresh, d.aux))
  return SlotState(decode=d, valid_BxN=valid_BxN)


def release(state: SlotState, rows_B: jax.Array) -> SlotState:
  """`state` with rows_B [B] stopped (their slots free)."""
  return state.replace(decode=state.decode.replace(
      done_B=state.decode.done_B | rows_B))


def refill_cap(sampler, slots: int, per_call: bool = False) -> int:
  """The most free slots that take a request at one admission point: the
  sampler's `max_refills` (None: all). The server's admission points
  (per_call) let a sampler whose step prefills any number of fresh rows
  (`grows_refills`: Flash-dLLM) fill every free slot. A sampler that is not
  Refillable refills only a whole batch (`admit`), so it takes all of
  them, once none is busy."""
  if not isinstance(sampler, Refillable):
    return slots
  if per_call and getattr(sampler, "grows_refills", False):
    return slots
  return min(sampler.max_refills or slots, slots)


def take(free_B, cap: int, waiting, xp=jnp):
  """[B] bool: the free slots that take a waiting request, in slot order,
  at most `cap` and `waiting` (how many wait) of them. The k-th of them
  takes the k-th waiting request. xp: jnp (in the compiled loop) or np."""
  order_B = xp.cumsum(free_B) - 1
  return free_B & (order_B < cap) & (order_B < waiting)


def refill(state: SlotState, free_B, cap: int, taken, count, prompts_UxP,
           valid_UxP, rng_U, sampling_U, *, sampler, mask_id: int,
           model_for: ModelFor):
  """Loads queue entries taken, taken + 1, ... (of `count`) into the free
  slots free_B [B] by the refill rule (`take`, at most `cap`; a sampler
  that is not Refillable loads only when every slot is free) and releases
  the free slots left empty. prompts_UxP, valid_UxP, rng_U, sampling_U
  (None: keep the state's): the queue's rows. Returns (state, entry_B: the
  entry each slot loaded, EMPTY elsewhere); entries load in queue order."""
  if not isinstance(sampler, Refillable):
    free_B = free_B & jnp.all(free_B)
  load_B = take(free_B, cap, count - taken)
  entry_B = jnp.where(load_B, taken + jnp.cumsum(load_B) - 1, EMPTY)
  idx_B = jnp.maximum(entry_B, 0)
  sampling_B = None if sampling_U is None else jax.tree.map(
      lambda u: u[idx_B], sampling_U)
  state = admit(release(state, free_B & ~load_B), load_B, prompts_UxP[idx_B],
                valid_UxP[idx_B], rng_U[idx_B], sampling_B, sampler=sampler,
                mask_id=mask_id, model_for=model_for)
  return state, entry_B
