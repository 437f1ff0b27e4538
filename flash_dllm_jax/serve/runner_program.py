"""The compiled side of serve/model_runner.py: the slot state at start and
the call's program (release, refill from the queue, decode in a
`lax.while_loop`), as pure functions of the runner's static sizes."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.sampling import Refillable, make_step, slots
from flash_dllm_jax.sampling.row_sampling import GREEDY, RowSampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.slots import EMPTY, SlotState
from flash_dllm_jax.serve.jobs import Jobs


@dataclasses.dataclass(frozen=True, eq=False)
class RunnerProgram:
  """A ModelRunner's device functions. p: the slots' prompt length; b:
  slots; q: queue entries a call takes; g: the generation region; g_all:
  positions after the prompt (g plus the sampler's tail); top_k: the
  top-logprobs buffer's width; row_data: the sampler takes RowSampling."""

  config: ModelConfig
  sampler: Any
  implementation: Any
  stop_ids: tuple
  p: int
  b: int
  q: int
  g: int
  g_all: int
  top_k: int
  row_data: bool

  def model(self, params, valid_BxN):
    return SequenceModel.for_batch(self.config, params, valid_BxN,
                                   self.implementation, self.stop_ids)

  def initial_state(self, params) -> SlotState:
    """Every slot empty (slots.start, done)."""
    b = self.b
    return slots.start(
        self.sampler, lambda v: self.model(params, v),
        jnp.full((b, self.p), self.config.pad_token_id, jnp.int32),
        jnp.ones((b, self.p), bool), self.g_all, self.config.mask_token_id,
        jax.vmap(jax.random.key)(jnp.zeros((b,), jnp.uint32)),
        RowSampling.of([GREEDY] * b, self.sampler) if self.row_data
        else None, done=True,
        top_k=self.top_k)

  def cycle(self, params, state: SlotState, release_B, prompt_QxP,
            valid_QxP, seed_Q, count, steps, sampling, record_top: bool):
    """Releases release_B, then decodes at most `steps` steps with the
    first `count` queue entries refilling free slots (model_runner.py; a
    sampler that is not Refillable loads at the call's start only, and a
    finished row ends the call). Returns (state, Jobs, job_B, taken,
    iters); without record_top the top buffer passes through."""
    kept = state.decode.top
    if not record_top:
      state = state.replace(decode=state.decode.replace(top=None))
    b, q = self.b, self.q
    gen, max_steps = slice(self.p, self.p + self.g), self.sampler.num_steps
    model_for = lambda v: self.model(params, v)
    rng_Q = jax.vmap(jax.random.key)(seed_Q)
    cap = slots.refill_cap(self.sampler, b, per_call=True)
    refillable = isinstance(self.sampler, Refillable)

    def refill(s, job_B, taken, jobs, free_B, step):
      s, entry_B = slots.refill(
          s, free_B, cap, taken, count, prompt_QxP, valid_QxP, rng_Q,
          sampling, sampler=self.sampler, mask_id=self.config.mask_token_id,
          model_for=model_for)
      loaded_B = entry_B != EMPTY
      job_B = jnp.where(loaded_B, b + entry_B,
                        jnp.where(free_B, EMPTY, job_B))
      return (s, job_B, taken + jnp.sum(loaded_B), jobs.loaded(entry_B, step),
              loaded_B)

    def body(carry):
      s, job_B, taken, jobs, i, _ = carry
      d = make_step(self.sampler, model_for(s.valid_BxN), self.p,
                    self.stop_ids)(s.decode)
      d = d.replace(done_B=d.done_B | (d.steps_B >= max_steps))
      finished_B = d.done_B & ~s.decode.done_B
      jobs = jobs.record(finished_B, job_B, d, gen)
      s = s.replace(decode=d)
      if not refillable:  # a new batch only once this one is done: the host
        return s, job_B, taken, jobs, i + 1, jnp.any(finished_B)
      s, job_B, taken, jobs, loaded_B = refill(s, job_B, taken, jobs,
                                               d.done_B, i + 1)
      # a finished row that nothing replaced: its answer (and the host's
      # next requests) should not wait for the rest of the call
      unfilled = jnp.any(finished_B & ~loaded_B) & (taken >= count)
      return s, job_B, taken, jobs, i + 1, unfilled

    def running(carry):
      s, _, _, _, i, unfilled = carry
      return (i < steps) & jnp.any(~s.decode.done_B) & ~unfilled

    state = slots.release(state, release_B)
    job_B = jnp.where(state.decode.done_B, EMPTY, jnp.arange(b))
    jobs = Jobs.empty(b + q, q, self.g, self.config.mask_token_id,
                      self.top_k if record_top else 0)
    state, job_B, taken, jobs, _ = refill(
        state, job_B, jnp.zeros((), jnp.int32), jobs, state.decode.done_B, 0)
    state, job_B, taken, jobs, iters, _ = jax.lax.while_loop(
        running, body, (state, job_B, taken, jobs, jnp.zeros((), jnp.int32),
                        jnp.zeros((), bool)))
    d = state.decode
    jobs = jobs.record(~d.done_B, job_B, d, gen)  # the running rows so far
    job_B = jnp.where(d.done_B, EMPTY, job_B)
    if not record_top:
      state = state.replace(decode=d.replace(top=kept))
    return state, jobs, job_B, taken, iters

