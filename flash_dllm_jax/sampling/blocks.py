"""Block machinery of the block-causal (block-diffusion) families: each
row's current block and its progress (BlockRows), where a row's block
starts, when a block and an answer end, and one step's draws over a block
(BlockDraw). LLaDA2's, SDAR's and Fast-dLLM v2's samplers and
llada2-flash share it.

Blocks of `block_length` are counted from each row's first prompt token,
so the last prompt block is shared with the first generated tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling.block_cache import BlockCache


@struct.dataclass
class BlockRows:
  """Per row: its current block (counted from its first prompt token), the
  steps spent in it, and whether its answer has ended; the BlockCache
  (None without block_cache)."""

  block_B: jax.Array
  step_B: jax.Array
  stop_B: jax.Array
  cache: BlockCache | None = None


@struct.dataclass
class BlockDraw:
  """A step's forward of the rows' current blocks: the block's slots
  rows_BxL and tokens block_BxL (active_BxL: its masks), the draws x0_BxL
  with their confidence p_BxL and log-probability lp_BxL under the model's
  softmax; aux with the blocks set, the updated cache, prompt lengths and
  block starts."""

  tokens_BxN: jax.Array
  aux: BlockRows
  cache: BlockCache | None
  prompt_B: jax.Array
  start_B: jax.Array
  rows_BxL: jax.Array
  block_BxL: jax.Array
  x0_BxL: jax.Array
  p_BxL: jax.Array
  lp_BxL: jax.Array
  active_BxL: jax.Array

  def write(self, block_BxL: jax.Array) -> jax.Array:
    """tokens_BxN with each row's block replaced by block_BxL."""
    b = self.tokens_BxN.shape[0]
    return self.tokens_BxN.at[jnp.arange(b)[:, None], self.rows_BxL].set(
        block_BxL)

  def logprobs(self) -> jax.Array:
    """[B, N] the draws' log-probabilities at their slots, 0 elsewhere."""
    b, n = self.tokens_BxN.shape
    return jnp.zeros((b, n), jnp.float32).at[
        jnp.arange(b)[:, None], self.rows_BxL].set(self.lp_BxL)


def first_rows(model, tokens_BxN: jax.Array, gen_length: int,
               tail_length: int, block_length: int,
               block_cache: bool = True) -> BlockRows:
  """Every row in the block of its first answer token, step 0."""
  p = tokens_BxN.shape[1] - gen_length - tail_length
  prompt_B = jnp.sum(model.valid_BxN[:, :p], axis=1, dtype=jnp.int32)
  zeros = jnp.zeros_like(prompt_B)
  cache = BlockCache.empty(model) if block_cache else None
  return BlockRows(prompt_B // block_length, zeros, zeros > 0, cache)


def reset_rows(aux: BlockRows, rows_B: jax.Array) -> BlockRows:
  """Forgets the rows' progress for a new request (block -1: the next step
  finds its first block from the new prompt)."""
  cache = None if aux.cache is None else aux.cache.reset_rows(rows_B)
  return BlockRows(jnp.where(rows_B, -1, aux.block_B),
                   jnp.where(rows_B, 0, aux.step_B), aux.stop_B & ~rows_B,
                   cache)


def current_block(model, aux: BlockRows, prompt_len: int, block_length: int):
  """(aux with every row's block set, prompt_B, start_B): the rows' prompt
  lengths and their current block's first canvas slot."""
  prompt_B = jnp.sum(model.valid_BxN[:, :prompt_len], axis=1,
                     dtype=jnp.int32)
  block_B = jnp.where(aux.block_B < 0, prompt_B // block_length, aux.block_B)
  start_B = block_B * block_length + prompt_len - prompt_B
  return aux.replace(block_B=block_B), prompt_B, start_B


def next_rows(model, aux: BlockRows, tokens_BxN, block_BxL, eos_B, start_B,
              prompt_B, prompt_len, gen_length: int, block_length: int,
              block_steps: int, eos_early_stop: bool) -> BlockRows:
  """The rows' next block and step, and which answers have ended, after a
  step left block_BxL in the current block (eos_B: it committed an EOS)."""
  step_B = aux.step_B + 1
  block_done_B = ~jnp.any(block_BxL == model.config.mask_token_id, axis=1) | (
      step_B >= block_steps)
  return end_rows(model, aux, tokens_BxN, block_done_B, step_B, start_B,
                  prompt_B, prompt_len, gen_length, block_length,
                  eos_block_stop=True,
                  early_eos_B=eos_B if eos_early_stop else None)


def end_rows(model, aux: BlockRows, tokens_BxN, block_done_B, step_B,
             start_B, prompt_B, prompt_len, gen_length: int,
             block_length: int, eos_block_stop: bool,
             early_eos_B=None) -> BlockRows:
  """The rows' next block (block_done_B: the current one is finished; a
  finished block's step count restarts at 0) and which answers have ended:
  after the last block; with eos_block_stop after a finished block with an
  EOS in the answer; with early_eos_B (the step committed an EOS) as soon
  as that EOS has no mask before it."""
  cfg, bl = model.config, block_length
  n = tokens_BxN.shape[1]
  idx_N = jnp.arange(n)
  answer_BxN = (idx_N >= prompt_len) & (idx_N < (start_B + bl)[:, None])
  eos_BxN = answer_BxN & (tokens_BxN == cfg.eos_token_id)
  stop_B = aux.stop_B
  if model.stop_ids:
    if eos_block_stop:
      stop_B = stop_B | (block_done_B & jnp.any(eos_BxN, axis=1))
    if early_eos_B is not None:
      first_B = jnp.argmax(eos_BxN, axis=1)
      before_BxN = answer_BxN & (idx_N < first_B[:, None])
      clear_B = ~jnp.any(before_BxN & (tokens_BxN == cfg.mask_token_id), 1)
      stop_B = stop_B | (early_eos_B & clear_B)
  block_B = aux.block_B + block_done_B
  ends_B = -(-(prompt_B + gen_length) // bl)  # the row's block count
  stop_B = stop_B | (block_B >= ends_B)
  return BlockRows(block_B, jnp.where(block_done_B, 0, step_B), stop_B,
                   aux.cache)


def edits(rows_BxL, block_BxL, x0_BxL, p_BxL, active_BxL, prompt_len: int,
          editing_threshold: float | None) -> jax.Array:
  """[B, L] LLaDA2.1's T2T edits: the block's committed answer tokens
  (slots rows_BxL, tokens block_BxL, masks active_BxL) whose draw x0_BxL
  differs, with confidence p_BxL > editing_threshold (None: none)."""
  if editing_threshold is None:
    return jnp.zeros_like(active_BxL)
  return (~active_BxL & (rows_BxL >= prompt_len) & (x0_BxL != block_BxL)
          & (p_BxL > editing_threshold))


def next_edit_block(model, aux: BlockRows, tokens_BxN, active_BxL,
                    block_BxL, edit_BxL, start_B, prompt_B, prompt_len: int,
                    gen_length: int, block_length: int, max_post_steps: int,
                    eos_block_stop: bool, early_eos_B=None) -> BlockRows:
  """The rows' next block under editing, after a step that began with masks
  active_BxL and left block_BxL (aux.step_B counts the post-edit steps
  entered in the block): it ends after a post-edit step without an edit, or
  when the next step would be post-edit step max_post_steps + 1. Stops as
  in end_rows."""
  mask_id = model.config.mask_token_id
  quiet_B = ~jnp.any(active_BxL, axis=1) & ~jnp.any(edit_BxL, axis=1)
  next_post_B = aux.step_B + ~jnp.any(block_BxL == mask_id, axis=1)
  done_B = quiet_B | (next_post_B > max_post_steps)
  return end_rows(model, aux, tokens_BxN, done_B, next_post_B, start_B,
                  prompt_B, prompt_len, gen_length, block_length,
                  eos_block_stop=eos_block_stop, early_eos_B=early_eos_B)
