"""BlockSteps: the block sampler's steps that LLaDA2's and SDAR's samplers
share (blocks, draws, the threshold-or-schedule choice, rows), for a frozen
dataclass with block_length, gen_length, block_steps, threshold,
temperature, top_k, top_p and block_cache.

A step runs the rows' current blocks (with block_cache, against the cached
prompt and finished blocks, block_cache.py; else the whole window) and
draws every block position: temperature 0 is greedy (argmax, the
confidence its softmax probability); above 0 logits / T, then top_k and
top_p, then a draw from the softmax with each row's own key, the
confidence the drawn token's probability. Per-row settings
(`DecodeState.sampling`, row_draws.py) replace the sampler's where given.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flash_dllm_jax import ops
from flash_dllm_jax.sampling import checks, row_draws, select
from flash_dllm_jax.sampling.block_cache import block_logits
from flash_dllm_jax.sampling.blocks import (BlockDraw, BlockRows,
                                            current_block, first_rows,
                                            reset_rows)
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


class BlockSteps:
  """Mixin: blocks, draws and row handling of a block sampler."""

  @property
  def tail_length(self) -> int:
    """Room past gen_length for the last block's positions."""
    return self.block_length - 1

  @property
  def num_steps(self) -> int:
    blocks = math.ceil(self.gen_length / self.block_length) + 1
    return blocks * self.block_steps

  def own_sampling(self) -> Sampling:
    """The row settings this sampler's own options state."""
    return Sampling(temperature=self.temperature,
                    top_p=1.0 if self.top_p is None else self.top_p,
                    top_k=self.top_k or 0)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len,
                      tail=self.tail_length)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> BlockRows:
    return first_rows(model, tokens_BxN, self.gen_length, self.tail_length,
                      self.block_length, self.block_cache)

  def finished(self, model, tokens_BxN, aux: BlockRows, prompt_len):
    return aux.stop_B

  def reset_rows(self, aux: BlockRows, rows_B: jax.Array) -> BlockRows:
    return reset_rows(aux, rows_B)

  def _draw(self, logits_BxLxV: jax.Array, rng_B: jax.Array, rows=None):
    """(tokens_BxL, confidence_BxL) as the reference samples them; rows:
    per-row settings (RowSampling) in place of the sampler's."""
    if rows is not None:
      l_BxLxV = row_draws.llada2_filtered(logits_BxLxV, rows)
      x0_BxL = row_draws.categorical_or_argmax(
          l_BxLxV, rows.temperature_B > 0, rng_B)
      return x0_BxL, select.prob_of(l_BxLxV, x0_BxL)
    if self.temperature == 0:
      x0_BxL = jnp.argmax(logits_BxLxV, axis=-1)
      return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)
    if self.temperature != 1:
      logits_BxLxV = logits_BxLxV / self.temperature
    if self.top_k is not None and self.top_k > 0:
      logits_BxLxV = select.top_k_filter(logits_BxLxV, self.top_k)
    if self.top_p is not None and self.top_p < 1:
      logits_BxLxV = select.top_p_filter(logits_BxLxV, self.top_p)
    x0_BxL = select.row_categorical(rng_B, logits_BxLxV)
    return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)

  def _thresholds(self, rows, b: int):
    """(tau_B, on_B): each row's threshold (its own, else the sampler's)
    and whether it has one; (None, None) when no row can."""
    own = jnp.float32(jnp.nan if self.threshold is None else self.threshold)
    if rows is None:
      if self.threshold is None:
        return None, None
      return jnp.full((b,), own), jnp.ones((b,), bool)
    tau_B = jnp.where(jnp.isnan(rows.threshold_B), own, rows.threshold_B)
    return tau_B, ~jnp.isnan(tau_B)

  def draw_block(self, model: SequenceModel, state: DecodeState,
                 rng_B: jax.Array, prompt_len: int, with_logits: bool = False
                 ) -> BlockDraw:
    """One forward of every row's current block and its draws (with_logits:
    (BlockDraw, the block's logits_BxLxV))."""
    bl = self.block_length
    tokens_BxN = state.tokens_BxN
    aux, prompt_B, start_B = current_block(model, state.aux, prompt_len, bl)
    rows_BxL = start_B[:, None] + jnp.arange(bl)
    cache = aux.cache
    if self.block_cache:
      logits_BxLxV, cache = block_logits(model, tokens_BxN, cache, start_B,
                                         ~state.done_B, bl)
    else:
      logits_BxLxV = model.logits(tokens_BxN, rows_BxL, block_length=bl)
    x0_BxL, p_BxL = self._draw(logits_BxLxV, rng_B, state.sampling)
    lp_BxL = ops.token_logprob(logits_BxLxV, x0_BxL)
    block_BxL = jnp.take_along_axis(tokens_BxN, rows_BxL, axis=1)
    d = BlockDraw(tokens_BxN, aux, cache, prompt_B, start_B, rows_BxL,
                  block_BxL, x0_BxL.astype(block_BxL.dtype), p_BxL, lp_BxL,
                  block_BxL == model.config.mask_token_id)
    return (d, logits_BxLxV) if with_logits else d

  def unmask(self, d: BlockDraw, k_B: jax.Array, rows) -> jax.Array:
    """[B, L] the masks a step commits: those with confidence above the
    row's threshold if there are at least k_B of them, else the k_B most
    confident (fewer if fewer masks are left)."""
    conf_BxL = jnp.where(d.active_BxL, d.p_BxL, select.NEG_INF)
    chosen_BxL = select.choose_top(conf_BxL, k_B)
    tau_B, on_B = self._thresholds(rows, conf_BxL.shape[0])
    if on_B is not None:
      high_BxL = d.active_BxL & (conf_BxL > tau_B[:, None])
      enough_B = on_B & (jnp.sum(high_BxL, axis=1) >= k_B)
      chosen_BxL = jnp.where(enough_B[:, None], high_BxL, chosen_BxL)
    return chosen_BxL
