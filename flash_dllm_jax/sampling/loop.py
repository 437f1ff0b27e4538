"""The decode loop: a `lax.while_loop` over DecodeState, and its Python twin.

Both call the same `step_fn`; tests check they give the same tokens.
"""

from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp

from flash_dllm_jax.config import ModelConfig
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
  """The same loop driven from Python (one host round trip per step)."""
  while bool(_running(state, max_steps)):
    state = step_fn(state)
  return state


class Forward(Protocol):
  """Logits [B, R, V] of the given rows for a full sequence of tokens."""

  def __call__(self, tokens_BxN: jax.Array,
               rows_BxR: jax.Array) -> jax.Array: ...


class Sampler(Protocol):
  """A decoding policy: which tokens to commit at each step.

  Samplers are frozen dataclasses (hashable, so they are static under jit)
  that validate their arguments in __post_init__.
  """

  gen_length: int

  @property
  def num_steps(self) -> int: ...

  @property
  def forwards_per_step(self) -> int: ...

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None: ...

  def propose(self, forward: Forward, tokens_BxN: jax.Array, step: jax.Array,
              rng_B: jax.Array, config: ModelConfig,
              prompt_len: int) -> jax.Array: ...


def make_step(sampler: Sampler, forward: Forward, config: ModelConfig,
              prompt_len: int, stop_ids: tuple[int, ...]) -> StepFn:
  """One decoding step: the sampler proposes tokens, `advance` commits them."""

  def step_fn(state: DecodeState) -> DecodeState:
    keys_Bx2 = jax.vmap(jax.random.split)(state.rng_B)
    proposed_BxN = sampler.propose(forward, state.tokens_BxN, state.step,
                                   keys_Bx2[:, 1], config, prompt_len)
    return advance(state, proposed_BxN, sampler.forwards_per_step, prompt_len,
                   config.mask_token_id, stop_ids, keys_Bx2[:, 0])

  return step_fn
