"""LLaDA2.1's decoding (inclusionAI's LLaDA2.1 `generate` in
modeling_llada2_moe.py): LLaDA2's blocks with token-to-token editing.

Each step runs one forward of the row's current block (LLaDA2Sampler's
draw: the exact block cache, greedy at temperature 0) and
  M2T  commits, among the block's masks, every one with confidence >
       `threshold` if there are at least `num_to_transfer` of them, else the
       `num_to_transfer` most confident;
  T2T  replaces every committed, non-prompt token of the block whose draw
       differs from it with confidence > `editing_threshold` (None: never).
A step that starts with no mask in the block is a post-edit step; the block
ends after a post-edit step that edits nothing, or before a post-edit step
past `max_post_steps` (no forward is spent then: the decision is taken at
the end of the step before). Answers end after the last block, or with
`eos_early_stop` after a block that leaves an EOS in the answer (a finished
block has no mask left, so that is the reference's "no mask and an EOS").
Without eos_early_stop every block is decoded, as the reference does; the
tokens up to the first EOS are the same either way (later blocks never
change earlier ones), only the model calls differ.

`steps` is unused, as in the reference. With editing off
(editing_threshold None) and num_to_transfer 1 this commits what llada2
with steps = block_length commits, plus one post-edit forward per block
(none with max_post_steps 0).

Edits reach the block's committed tokens only, so the finished blocks'
cache stays exact. Per-row temperature / top_k / top_p / threshold as in
LLaDA2Sampler. An edited token reports its new draw's log-probability.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
from flash_dllm_jax.sampling import blocks
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

# LLaDA2.1's two decoding modes (threshold, editing_threshold,
# max_post_steps; block_length 32, temperature 0): quality as diffusers'
# LLaDA2 pipeline documents it; speed as SGLang documents JointThreshold's
# defaults (diffusers lists speed with editing off instead).
MODES = {"speed": dict(threshold=0.5, editing_threshold=0.0,
                       max_post_steps=16),
         "quality": dict(threshold=0.7, editing_threshold=0.5,
                         max_post_steps=16)}


@dataclasses.dataclass(frozen=True)
class LLaDA21Sampler(LLaDA2Sampler):
  """LLaDA2Sampler's blocks, draws and stops plus the reference's editing
  arguments (its defaults): editing_threshold (None: no T2T edits),
  max_post_steps, num_to_transfer (M2T's minimum per step)."""

  editing_threshold: float | None = option(
      0.9, "confidence above which a committed token whose draw differs is "
      "replaced (T2T)", ge=-1, le=1, none="no edits")
  max_post_steps: int = option(16, "post-edit steps a block may run once "
                               "it has no mask", ge=0)
  num_to_transfer: int = option(1, "masks a step commits at least (M2T)",
                                ge=1)

  @property
  def num_steps(self) -> int:
    """A block takes at most block_length unmasking steps (each commits a
    mask) and max_post_steps post-edit steps."""
    n_blocks = math.ceil(self.gen_length / self.block_length) + 1
    return n_blocks * (self.block_length + self.max_post_steps)

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    d = self.draw_block(model, state, rng_B, prompt_len)
    b = d.block_BxL.shape[0]
    k_B = jnp.full((b,), self.num_to_transfer, jnp.int32)
    commit_BxL = self.unmask(d, k_B, state.sampling)
    edit_BxL = self.edits(d, prompt_len)
    change_BxL = commit_BxL | edit_BxL
    block_BxL = jnp.where(change_BxL, d.x0_BxL, d.block_BxL)
    tokens_BxN = d.write(block_BxL)
    rows = blocks.next_edit_block(
        model, d.aux, tokens_BxN, d.active_BxL, block_BxL, edit_BxL,
        d.start_B, d.prompt_B, prompt_len, self.gen_length, self.block_length,
        self.max_post_steps, eos_block_stop=self.eos_early_stop)
    return tokens_BxN, rows.replace(cache=d.cache), 1, d.logprobs()

  def edits(self, d: blocks.BlockDraw, prompt_len: int) -> jax.Array:
    return blocks.edits(d.rows_BxL, d.block_BxL, d.x0_BxL, d.p_BxL,
                        d.active_BxL, prompt_len, self.editing_threshold)

