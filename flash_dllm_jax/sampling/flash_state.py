"""Flash-dLLM's loop state (FlashCacheAux) and a step's trace (StepTrace)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.model import KVCache
from flash_dllm_jax.sampling import flash_budget, flash_verify


@struct.dataclass
class FlashCacheAux:
  """Per-row bookkeeping carried through the loop.

  cache: KV of every slot. rank_BxN / last_BxN: the reference's order of
  decoded positions (flash_budget.py): the last step's rank of every slot
  (summed window q.k, or attention mass) and the batch committed last.
  conf_BxN: last confidence of each masked position (NOT_SCORED if never
  scored; the "confident" window). end_B: one past the answer's end token,
  N + 1 while none is committed. tail_done_BxN: EOS-tail positions
  committed (eos_tail). fresh_B: rows whose next step is a prefill (a new
  request in the slot).
  """

  cache: KVCache
  rank_BxN: jax.Array
  last_BxN: jax.Array
  conf_BxN: jax.Array
  end_B: jax.Array
  tail_done_BxN: jax.Array
  fresh_B: jax.Array

  @classmethod
  def start(cls, cache: KVCache, b: int, n: int) -> "FlashCacheAux":
    """Every row fresh: nothing ranked, scored or ended yet."""
    return cls(cache=cache, rank_BxN=flash_budget.initial_rank(b, n),
               last_BxN=jnp.zeros((b, n), bool),
               conf_BxN=jnp.full((b, n), flash_budget.NOT_SCORED,
                                 jnp.float32),
               end_B=jnp.full((b,), n + 1, jnp.int32),
               tail_done_BxN=jnp.zeros((b, n), bool),
               fresh_B=jnp.ones((b,), bool))


class StepTrace(NamedTuple):
  """What one step did; plan / p / keep are None without verification."""

  tokens_BxN: jax.Array
  aux: FlashCacheAux
  forwards_B: jax.Array
  plan: flash_verify.VerifyPlan | None
  p_BxC: jax.Array | None
  keep_BxC: jax.Array | None
  logprob_BxN: jax.Array | None = None  # committed tokens' log-probability
  top: object = None  # their alternatives (top_logprobs.TopLogprobs)
