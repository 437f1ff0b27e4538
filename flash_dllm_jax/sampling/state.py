"""Decode state carried through the compiled loop, and its pure updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling import top_logprobs


@struct.dataclass
class DecodeState:
  """Everything that changes from one decoding step to the next.

  tokens_BxN: prompt (left-padded) followed by the generation region, which
    starts as mask tokens.
  step: scalar step counter (shared by all rows).
  done_B: rows whose answer is complete; they are frozen.
  forwards_B: model forward passes spent on each row.
  steps_B: steps each row was still running (its own decoding steps).
  rng_B: one PRNG key per row, so a row's random draws never depend on the
    rest of the batch.
  aux: the strategy's own pytree (a KV cache, tracked positions, ...), None
    for the uncached reference samplers.
  sampling: per-row temperature / top_p / top_k and rule options
    (threshold, factor, gamma; row_sampling.RowSampling), None: every row
    with the sampler's own options (greedy where it has none). Samplers
    with `row_fields` (row_sampling.py) read it.
  logprob_BxN: each position's token's log-probability at the step it was
    committed (float32; 0 for the prompt and for samplers that do not
    report it, see `advance`).
  top: None, or a top_logprobs.TopLogprobs buffer [B, N, K] that samplers
    which record alternatives fill as they fill logprob_BxN.
  """

  tokens_BxN: jax.Array
  step: jax.Array
  done_B: jax.Array
  forwards_B: jax.Array
  rng_B: jax.Array
  aux: object = None
  steps_B: jax.Array | None = None
  sampling: object = None
  logprob_BxN: jax.Array | None = None
  top: object = None

  @classmethod
  def start(cls, prompt_BxP: jax.Array, gen_length: int, mask_id: int,
            rng_B: jax.Array, sampling=None) -> "DecodeState":
    b = prompt_BxP.shape[0]
    masks_BxG = jnp.full((b, gen_length), mask_id, prompt_BxP.dtype)
    return cls(tokens_BxN=jnp.concatenate([prompt_BxP, masks_BxG], axis=1),
               step=jnp.zeros((), jnp.int32), done_B=jnp.zeros((b,), bool),
               forwards_B=jnp.zeros((b,), jnp.int32), rng_B=rng_B,
               steps_B=jnp.zeros((b,), jnp.int32), sampling=sampling,
               logprob_BxN=jnp.zeros(tokens_shape(prompt_BxP, gen_length),
                                     jnp.float32))


def where_keys(pick_B: jax.Array, a_B: jax.Array, b_B: jax.Array):
  """jnp.where for typed PRNG key arrays."""
  data = jnp.where(pick_B[:, None], jax.random.key_data(a_B),
                   jax.random.key_data(b_B))
  return jax.random.wrap_key_data(data)


def tokens_shape(prompt_BxP, gen_length: int) -> tuple[int, int]:
  return prompt_BxP.shape[0], prompt_BxP.shape[1] + gen_length


def answer_complete(gen_BxG: jax.Array, mask_id: int,
                    stop_ids: tuple[int, ...]) -> jax.Array:
  """[B] bool: no mask remains before the first stop token (or at all).

  Tokens after the first stop token are not part of the answer, so a row is
  finished once everything before it is decoded. With no stop ids, a row is
  finished when it has no mask left.
  """
  g = gen_BxG.shape[1]
  masked_BxG = gen_BxG == mask_id
  if not stop_ids:
    return ~jnp.any(masked_BxG, axis=1)
  is_stop_BxG = jnp.isin(gen_BxG, jnp.asarray(stop_ids, gen_BxG.dtype))
  first_stop_B = jnp.where(jnp.any(is_stop_BxG, axis=1),
                           jnp.argmax(is_stop_BxG, axis=1), g)
  before_BxG = jnp.arange(g)[None, :] < first_stop_B[:, None]
  return ~jnp.any(masked_BxG & before_BxG, axis=1)


def advance(state: DecodeState, proposed_BxN: jax.Array, aux,
            forwards: int | jax.Array, prompt_len: int, mask_id: int,
            stop_ids: tuple[int, ...], rng_B: jax.Array,
            complete=None, logprob_BxN=None, top=None) -> DecodeState:
  """Commits a step's tokens for the rows still running; frozen rows keep
  theirs, so finishing early never changes a row's tokens. complete: the
  sampler's own test of a finished row (tokens_BxN -> [B] bool), else
  `answer_complete`. logprob_BxN: the proposed tokens' log-probabilities
  (the sampler's, None if it has none), kept where a token was written (a
  mask committed, or a committed token edited); top: their alternatives
  (top_logprobs.TopLogprobs, None: none), kept there too."""
  active_B = ~state.done_B
  tokens_BxN = jnp.where(active_B[:, None], proposed_BxN, state.tokens_BxN)
  kept_BxN, kept_top = state.logprob_BxN, state.top
  new_BxN = (state.tokens_BxN != tokens_BxN) & (tokens_BxN != mask_id)
  if logprob_BxN is not None and kept_BxN is not None:
    kept_BxN = jnp.where(new_BxN, logprob_BxN, kept_BxN)
  if top is not None and kept_top is not None:
    kept_top = top_logprobs.keep(kept_top, top, new_BxN)
  if complete is None:
    complete_B = answer_complete(tokens_BxN[:, prompt_len:], mask_id, stop_ids)
  else:
    complete_B = complete(tokens_BxN)
  done_B = state.done_B | complete_B
  return DecodeState(tokens_BxN=tokens_BxN, step=state.step + 1,
                     done_B=done_B,
                     forwards_B=state.forwards_B + forwards * active_B,
                     steps_B=state.steps_B + active_B,
                     rng_B=rng_B, aux=aux, sampling=state.sampling,
                     logprob_BxN=kept_BxN, top=kept_top)


def fill_after_stop(gen_BxG: jax.Array, mask_id: int, fill_id: int) -> jax.Array:
  """Masks left in a finished row (all after its stop token) become fill_id."""
  return jnp.where(gen_BxG == mask_id, fill_id, gen_BxG)
