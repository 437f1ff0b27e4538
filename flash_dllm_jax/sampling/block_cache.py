"""The exact cache of finished blocks for block-causal (block-diffusion)
models: a finished block's keys and values depend on it and earlier blocks
only, so once written they are the ones every later full-window forward
would compute, and a step needs to run only its current block.

Each row's current block [start, start + L) gets its logits from exactly
one of three forwards, all through SequenceModel.block_cached (the uncached
forward's own attention, so every query row reduces over the same keys in
the same order as there):
  window  rows with nothing cached yet (their first step, a new request):
          every slot, which writes the prompt's and earlier blocks' K/V;
  pair    rows whose previous block finished last step: that block (its
          final tokens, so its K/V become final) and the current one;
  block   the other rows: the current block alone.
A row takes one model call a step, as the uncached loop does.

With shift = 1 (families whose logits row i predicts position i + 1,
config.logits_shift) a block position reads the row one slot before it,
the first one the previous block's last row: the block forward then starts
one slot earlier (that slot's K/V, final already, are written again with
the same values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.model import KVCache
from flash_dllm_jax.sampling.sequence_model import SequenceModel


@struct.dataclass
class BlockCache:
  """cache: K/V of every slot; final_B: the slot up to which each row's
  cache is final (-1: nothing yet, the next step runs the window)."""

  cache: KVCache
  final_B: jax.Array

  @classmethod
  def empty(cls, model: SequenceModel) -> "BlockCache":
    b = model.valid_BxN.shape[0]
    return cls(model.empty_cache(), jnp.full((b,), -1, jnp.int32))

  def reset_rows(self, rows_B: jax.Array) -> "BlockCache":
    """The rows' next step runs their whole window (a new request)."""
    return self.replace(final_B=jnp.where(rows_B, -1, self.final_B))


def block_logits(model: SequenceModel, tokens_BxN: jax.Array, bc: BlockCache,
                 start_B: jax.Array, active_B: jax.Array, block_length: int,
                 shift: int = 0) -> tuple[jax.Array, BlockCache]:
  """(logits_BxLxV predicting each active row's block at start_B, the
  cache with everything before start_B final); inactive rows get zeros and
  keep their cache. shift: the rows read sit that many slots earlier."""
  b, n = tokens_BxN.shape
  l, rows = block_length, jnp.arange(b)[:, None]
  window_B = active_B & (bc.final_B < 0)
  pair_B = active_B & ~window_B & (bc.final_B < start_B)
  block_B = active_B & ~window_B & ~pair_B
  no_logits = jnp.zeros((b, l, model.config.vocab_size), jnp.float32)
  skip = lambda cache: (no_logits, cache)

  def window(cache):
    slots_BxN = jnp.where(window_B[:, None], jnp.arange(n), -1)
    rows_BxL = jnp.maximum(start_B[:, None] - shift + jnp.arange(l), 0)
    return model.block_cached(tokens_BxN, slots_BxN, cache, rows_BxL, l)

  def span(first_B, width, mine_B):
    """A forward of slots [first, first + width), logits of the L rows
    before its last `shift`."""
    def run(cache):
      slots_BxQ = first_B[:, None] + jnp.arange(width)
      tokens_BxQ = tokens_BxN[rows, jnp.clip(slots_BxQ, 0, n - 1)]
      slots_BxQ = jnp.where(mine_B[:, None] & (slots_BxQ >= 0), slots_BxQ, -1)
      logit_rows = jnp.broadcast_to(width - l - shift + jnp.arange(l),
                                    (b, l))
      return model.block_cached(tokens_BxQ, slots_BxQ, cache, logit_rows, l)
    return run

  cache = bc.cache
  win_BxLxV, cache = jax.lax.cond(jnp.any(window_B), window, skip, cache)
  pair_BxLxV, cache = jax.lax.cond(jnp.any(pair_B),
                                   span(start_B - l, 2 * l, pair_B), skip,
                                   cache)
  blk_BxLxV, cache = jax.lax.cond(jnp.any(block_B),
                                  span(start_B - shift, l + shift, block_B),
                                  skip, cache)
  pick = lambda m_B, a, b_: jnp.where(m_B[:, None, None], a, b_)
  logits_BxLxV = pick(window_B, win_BxLxV,
                      pick(pair_B, pair_BxLxV, blk_BxLxV))
  final_B = jnp.where(active_B, start_B, bc.final_B)
  return logits_BxLxV, BlockCache(cache, final_B)
