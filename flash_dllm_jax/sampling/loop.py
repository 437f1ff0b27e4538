"""The decode loop: a `lax.while_loop` over DecodeState, and its Python twin.

Both call the same `step_fn`; tests check they give the same tokens.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from flash_dllm_jax.compilation import compiler_options
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState, advance

StepFn = Callable[[DecodeState], DecodeState]


def _running(state: DecodeState, max_steps: int) -> jax.Array:
  return (state.step < max_steps) & ~jnp.all(state.done_B)


def run_compiled(step_fn: StepFn, state: DecodeState,
                 max_steps: int) -> DecodeState:
  """Runs steps on device until every row is done or max_steps is reached."""
  return jax.lax.while_loop(lambda s: _running(s, max_steps), step_fn, state)


def run_python(step_fn: StepFn, state: DecodeState,
               max_steps: int) -> DecodeState:
  """The same loop driven from Python: the step compiled on its own (with
  the decode loops' XLA options), one host round trip per step."""
  step = jax.jit(step_fn, compiler_options=compiler_options())
  while bool(_running(state, max_steps)):
    state = step(state)
  return state


class Uncached:
  """The ends of a sampler that keeps no state of its own and runs exactly
  `steps` steps (LLaDA's and Dream's reference samplers)."""

  @property
  def num_steps(self) -> int:
    return self.steps

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    return None


class Sampler(Protocol):
  """A decoding policy: which positions to run and which tokens to commit.

  Samplers are frozen dataclasses (hashable, so they are static under jit)
  that validate their arguments in __post_init__.
  """

  gen_length: int

  @property
  def num_steps(self) -> int:
    """The most steps the loop may run."""

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None: ...

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array):
    """The strategy's initial `DecodeState.aux` (None if it keeps nothing)."""

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    """(tokens_BxN, aux, forwards[, logprob_BxN[, top]]): the step's tokens
    for every row, the new aux, the forward passes spent (an int or [B]),
    and optionally each proposed token's log-probability (read where a mask
    is committed: DecodeState.logprob_BxN) and, for a sampler that
    `records_top` when state.top is set, their alternatives
    (top_logprobs.TopLogprobs [B, N, K])."""


@runtime_checkable
class Refillable(Protocol):
  """A sampler whose slots can take a new request inside the loop
  (continuous batching): it forgets a slot's bookkeeping on demand."""

  max_refills: int | None

  def reset_rows(self, aux, rows_B: jax.Array):
    """aux with the rows marked by rows_B [B] reset for a new request."""


@runtime_checkable
class KeepsTail(Protocol):
  """A sampler that decodes positions after the generation region (the
  reference Flash-dLLM's EOS tail); they are not part of the answer."""

  tail_length: int


def records_top(sampler) -> bool:
  """Whether `sampler` returns each written token's top-K alternatives when
  the state carries a buffer for them (its `records_top`;
  top_logprobs.py)."""
  return bool(getattr(sampler, "records_top", False))


def tail_length(sampler) -> int:
  """Positions after the generation a decode of `sampler` allocates."""
  return sampler.tail_length if isinstance(sampler, KeepsTail) else 0


@runtime_checkable
class EndsRows(Protocol):
  """A sampler that decides itself when a row's answer is complete (instead
  of "no mask before the first stop token")."""

  def finished(self, model: SequenceModel, tokens_BxN: jax.Array, aux,
               prompt_len: int) -> jax.Array:
    """[B] bool."""


def make_step(sampler: Sampler, model: SequenceModel, prompt_len: int,
              stop_ids: tuple[int, ...]) -> StepFn:
  """One decoding step: the sampler proposes tokens, `advance` commits them."""

  def step_fn(state: DecodeState) -> DecodeState:
    keys_Bx2 = jax.vmap(jax.random.split)(state.rng_B)
    out = sampler.propose(model, state, keys_Bx2[:, 1], prompt_len)
    tokens_BxN, aux, forwards = out[:3]
    complete = None
    if isinstance(sampler, EndsRows):
      complete = lambda t: sampler.finished(model, t, aux, prompt_len)
    return advance(state, tokens_BxN, aux, forwards, prompt_len,
                   model.config.mask_token_id, stop_ids, keys_Bx2[:, 0],
                   complete=complete,
                   logprob_BxN=out[3] if len(out) > 3 else None,
                   top=out[4] if len(out) > 4 else None)

  return step_fn
