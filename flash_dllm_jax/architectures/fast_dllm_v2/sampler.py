"""Strategy `fast-dllm-v2`: Fast-dLLM v2's decoding (`batch_sample` of
NVlabs/Fast-dLLM v2/generation_functions.py, the loop of the remote code's
`generate`), every row at its own pace in one compiled loop, over the exact
cache of finished blocks.

Blocks of `block_length` are counted from each row's first prompt token; a
block's positions are decoded in sub-blocks of `small_block_length`, in
order. The logits row at position i predicts i + 1 (the token shift), so a
block's position j is drawn from the block forward's row j - 1 (row 0 for
position 0, the reference's `cat(logits[:1], logits[:-1])`). A step is one
forward of one of two kinds:
  denoise  the block holds masks: among the masks of its first sub-block
           with a mask, commit every draw with confidence > threshold and
           always the most confident one (the first on ties). With
           `sub_block_cache` (the reference's use_block_cache) a step whose
           sub-block starts with a committed token runs that sub-block
           alone against the block's K/V of its last whole-block forward
           (the reference's block_past_key_values); a block's first step
           and a sub-block starting with a mask run the whole block.
  store    the block is complete: one forward of it, which writes its K/V,
           and the argmax of its last row (greedy at every temperature, as
           there) becomes the next block's first token.
A prompt ending on a block boundary starts with a store step of its last
block (the reference's prefill, whose last row gives the first token).
The draw is the reference's sample_with_top_p: temperature 0 is argmax with
its softmax probability as confidence; above 0, logits / temperature, then
top_p (top_k as in the other samplers), a draw, the confidence the drawn
token's probability after the filters. An answer ends after the block in
which a denoise step committed a stop id (its remaining masks are decoded,
no store forward follows), or after gen_length / block_length blocks
counted from the prompt's block (its last block's store forward, which only
predicts a token past the answer, is not run).

Model calls: one a step. The reference also spends a prefill forward on the
prompt's whole blocks; here the first step's forward writes them (for a
prompt ending mid-block), or is that prefill (a prompt ending on a block
boundary).

Deliberate differences: a prompt exactly one block long is decoded as
longer ones are (the reference skips its prefill then, and its first block
attends to no prompt); only stop ids committed by a denoise step end an
answer, as in batch_sample (the remote code's generate also stops on a stop
id predicted by a store step, and stops a block early once a stop id has no
mask before it).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.sampling import checks, draw_settings, options, select
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.block_steps import BlockSteps
from flash_dllm_jax.sampling.blocks import current_block
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@struct.dataclass
class V2Rows:
  """Per row: its current block, the denoise steps spent in it, whether a
  denoise step of it committed a stop id, whether its answer has ended;
  the BlockCache."""

  block_B: jax.Array
  step_B: jax.Array
  hit_B: jax.Array
  stop_B: jax.Array
  cache: BlockCache


@dataclasses.dataclass(frozen=True)
class FastDLLMV2Sampler:
  """batch_sample's arguments (max_new_tokens: gen_length, a multiple of
  block_length; block_size / small_block_size: block_length /
  small_block_length; use_block_cache: sub_block_cache) with the defaults of
  the published chatbot (threshold 0.9, sub-blocks of 8). top_k None: off
  (the reference has none). max_refills: options.max_refills. temperature /
  top_k / top_p are also per row (`DecodeState.sampling`)."""

  row_fields: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k")

  gen_length: int = option(128, "answer tokens decoded (a multiple of "
                           "block_length)", ge=1)
  block_length: int = option(32, "tokens per block (blocks counted from the "
                             "prompt's first token)", ge=1)
  small_block_length: int = option(8, "tokens per sub-block (divides "
                                   "block_length)", ge=1)
  threshold: float = option(0.9, "confidence above which a sub-block's masks "
                            "commit (the most confident always does)",
                            ge=0, le=1)
  sub_block_cache: bool = option(False, "run only the sub-block against the "
                                 "block's K/V of its last whole-block "
                                 "forward (the reference's use_block_cache)")
  temperature: float = draw_settings.TEMPERATURE.field(0.0)
  top_k: int | None = draw_settings.TOP_K.field()
  top_p: float | None = dataclasses.field(default=0.95, metadata={
      "option": dataclasses.replace(draw_settings.TOP_P.spec,
                                    none="off (1.0)")})
  max_refills: int | None = max_refills()

  def __post_init__(self):
    options.check(self, self._joint_errors)

  def _joint_errors(self) -> list[str]:
    errors = []
    if self.gen_length % self.block_length:
      errors.append(f"gen_length ({self.gen_length}) must be a multiple of "
                    f"block_length ({self.block_length})")
    if self.block_length % self.small_block_length:
      errors.append(f"block_length ({self.block_length}) must be a multiple "
                    f"of small_block_length ({self.small_block_length})")
    return errors

  tail_length = 0  # the last block ends at most gen_length past the prompt
  own_sampling = BlockSteps.own_sampling
  _draw = BlockSteps._draw

  @property
  def num_steps(self) -> int:
    """Every block's masks (one a step at least) and its store step."""
    return (self.gen_length // self.block_length + 1) * (
        self.block_length + 1)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len, tail=0)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> V2Rows:
    b = tokens_BxN.shape[0]
    zeros = jnp.zeros((b,), jnp.int32)
    return V2Rows(zeros - 1, zeros, zeros > 0, zeros > 0,
                  BlockCache.empty(model))

  def finished(self, model, tokens_BxN, aux: V2Rows, prompt_len):
    return aux.stop_B

  def reset_rows(self, aux: V2Rows, rows_B: jax.Array) -> V2Rows:
    """A new request in the rows: its first block found at its next step."""
    return V2Rows(jnp.where(rows_B, -1, aux.block_B),
                  jnp.where(rows_B, 0, aux.step_B), aux.hit_B & ~rows_B,
                  aux.stop_B & ~rows_B, aux.cache.reset_rows(rows_B))

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    cfg, bl, sbl = model.config, self.block_length, self.small_block_length
    tokens_BxN = state.tokens_BxN
    b, n = tokens_BxN.shape
    rows = jnp.arange(b)[:, None]
    # A row's first block holds its last prompt token: a prompt ending on a
    # boundary starts with that block's store step (the prefill).
    prompt_B = jnp.sum(model.valid_BxN[:, :prompt_len], axis=1,
                       dtype=jnp.int32)
    first = state.aux.replace(block_B=jnp.where(
        state.aux.block_B < 0, (prompt_B - 1) // bl, state.aux.block_B))
    aux, prompt_B, start_B = current_block(model, first, prompt_len, bl)
    slots_BxL = start_B[:, None] + jnp.arange(bl)
    block_BxL = jnp.take_along_axis(tokens_BxN, slots_BxL, axis=1)
    mask_BxL = block_BxL == cfg.mask_token_id
    active_B = ~state.done_B
    store_B = active_B & ~jnp.any(mask_BxL, axis=1)
    # The current sub-block: the first one holding a mask.
    sub_start_B = (jnp.argmax(mask_BxL, axis=1) // sbl) * sbl
    sub_B = active_B & ~store_B & (aux.step_B > 0) & jnp.asarray(
        self.sub_block_cache) & ~jnp.take_along_axis(
            mask_BxL, sub_start_B[:, None], axis=1)[:, 0]

    full_BxLxV, bc = block_logits(model, tokens_BxN, aux.cache, start_B,
                                  active_B & ~sub_B, bl)

    def sub_run(cache):
      slots_BxS = (start_B + sub_start_B)[:, None] + jnp.arange(sbl)
      toks_BxS = tokens_BxN[rows, jnp.clip(slots_BxS, 0, n - 1)]
      slots_BxS = jnp.where(sub_B[:, None], slots_BxS, -1)
      return model.block_cached(toks_BxS, slots_BxS, cache,
                                jnp.broadcast_to(jnp.arange(sbl), (b, sbl)),
                                bl)

    no_logits = jnp.zeros((b, sbl, cfg.vocab_size), jnp.float32)
    sub_BxSxV, cache = jax.lax.cond(jnp.any(sub_B), sub_run,
                                    lambda c: (no_logits, c), bc.cache)
    # Position j's logits: row j - 1 of its forward (row 0 for its first).
    pos_L = jnp.arange(bl)
    full_rows = jnp.broadcast_to(jnp.maximum(pos_L - 1, 0), (b, bl))
    sub_rows = jnp.clip(pos_L[None] - sub_start_B[:, None] - 1, 0, sbl - 1)
    take = lambda x, r: jnp.take_along_axis(x, r[:, :, None], axis=1)
    pred_BxLxV = jnp.where(sub_B[:, None, None], take(sub_BxSxV, sub_rows),
                           take(full_BxLxV, full_rows))

    x_BxL, p_BxL = self._draw(pred_BxLxV, rng_B, state.sampling)
    x_BxL = x_BxL.astype(block_BxL.dtype)
    lp_BxL = ops.token_logprob(pred_BxLxV, x_BxL)
    in_sub_BxL = (pos_L[None] >= sub_start_B[:, None]) & (
        pos_L[None] < sub_start_B[:, None] + sbl)
    cand_BxL = mask_BxL & in_sub_BxL & (active_B & ~store_B)[:, None]
    conf_BxL = jnp.where(cand_BxL, p_BxL, select.NEG_INF)
    best_BxL = pos_L[None] == jnp.argmax(conf_BxL, axis=1)[:, None]
    chosen_BxL = cand_BxL & ((conf_BxL > self.threshold) | best_BxL)
    new_BxL = jnp.where(chosen_BxL, x_BxL, block_BxL)
    tokens_BxN = tokens_BxN.at[rows, slots_BxL].set(new_BxL)
    # A store step's next token: the argmax of the block's last row.
    next_B = jnp.argmax(full_BxLxV[:, -1], axis=-1).astype(tokens_BxN.dtype)
    next_slot_B = jnp.minimum(start_B + bl, n - 1)
    lp_next_B = ops.token_logprob(full_BxLxV[:, -1:], next_B[:, None])[:, 0]
    old_B = tokens_BxN[jnp.arange(b), next_slot_B]
    tokens_BxN = tokens_BxN.at[jnp.arange(b), next_slot_B].set(
        jnp.where(store_B, next_B, old_B))
    logprob_BxN = jnp.zeros((b, n), jnp.float32).at[rows, slots_BxL].set(
        lp_BxL)
    logprob_BxN = logprob_BxN.at[jnp.arange(b), next_slot_B].set(
        jnp.where(store_B, lp_next_B,
                  logprob_BxN[jnp.arange(b), next_slot_B]))

    stops = jnp.asarray(model.stop_ids or (-1,))
    hit_B = aux.hit_B | jnp.any(chosen_BxL & jnp.isin(x_BxL, stops), axis=1)
    ends_B = prompt_B // bl + self.gen_length // bl  # the reference's blocks
    complete_B = ~jnp.any(new_BxL == cfg.mask_token_id, axis=1)
    stop_B = aux.stop_B | (active_B & ~store_B & complete_B & (
        hit_B | (aux.block_B + 1 >= ends_B)))
    final_B = jnp.where(store_B, start_B + bl, bc.final_B)
    rows_out = V2Rows(
        block_B=jnp.where(store_B, aux.block_B + 1, aux.block_B),
        step_B=jnp.where(store_B, 0, aux.step_B + active_B),
        hit_B=jnp.where(store_B, False, hit_B), stop_B=stop_B,
        cache=BlockCache(cache, final_B))
    return tokens_BxN, rows_out, 1, logprob_BxN
