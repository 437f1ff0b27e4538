"""LLaDA2.x's block-diffusion sampler (inclusionAI's `generate` in
modeling_llada2_moe.py), every row at its own pace in one compiled loop.

Blocks of `block_length` are counted from each row's first prompt token, so
the last prompt block is shared with the first generated tokens, as there.
Each step runs the model on the row's window (every block up to the current
one; later blocks are invisible through the block-causal mask, so the whole
canvas runs and gives the window's logits) and commits, among the current
block's masks, every one with confidence > `threshold` if there are at
least the step's scheduled count of them, else the scheduled count of the
most confident (`threshold=None`: always the scheduled count). A block ends
when no mask is left in it (no forward is spent on it then), and the answer
ends after a block holding an EOS, or, with `eos_early_stop`, as soon as an
EOS is committed with no mask before it. The model gets ceil((prompt +
gen_length) / block_length) whole blocks; `tokens` keep gen_length.

With `block_cache` (the default) a step runs only the current block (and,
once, the block just finished) against the cached K/V of the prompt and the
finished blocks (block_cache.py), which gives the uncached loop's tokens and
model calls; block_cache=False re-runs the whole window each step, as the
reference does.

Temperature 0 is greedy (argmax, the confidence its softmax probability):
LLaDA2.1's rule. LLaDA2.0's code samples from softmax(logits) at every
temperature, 0 included; temperature 1 does that here. Above 0: logits / T,
then top_k and top_p, then a draw from the softmax with each row's own key,
the confidence the drawn token's probability. temperature / top_k / top_p
come from the sampler, or per row from `DecodeState.sampling` (row_draws.py,
the same draw with each row's values). Each committed token's
log-probability is read from the softmax of the model's logits, before
temperature and filters. Deliberate difference: only
the answer's EOS counts (the reference's early stop also looks at the
prompt, which here holds left padding).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.sampling import (checks, commit_rules, draw_settings,
                                     options, row_draws, select)
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.sampling.block_cache import BlockCache, block_logits
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@struct.dataclass
class BlockRows:
  """Per row: its current block (counted from its first prompt token), the
  steps spent in it, and whether its answer has ended; the BlockCache
  (None without block_cache)."""

  block_B: jax.Array
  step_B: jax.Array
  stop_B: jax.Array
  cache: BlockCache | None = None


@dataclasses.dataclass(frozen=True)
class LLaDA2Sampler:
  """The reference `generate`'s arguments and defaults (gen_length aside).

  block_cache: run the current block against the cached prompt and
    finished blocks (False: the whole window each step, as the reference).
  max_refills: under continuous batching, at most this many slots take a
    new request per loop step (None: any number).
  temperature / top_k / top_p and threshold are also per row
  (`DecodeState.sampling`, which replaces them where given; a row's
  threshold None keeps the sampler's).
  """

  row_fields: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k",
                                           "threshold")

  gen_length: int = option(128, "answer tokens decoded", ge=1)
  block_length: int = option(32, "tokens per block (blocks counted from "
                             "the prompt's first token)", ge=1)
  steps: int = option(32, "steps a block is scheduled over (each commits "
                      "its share at least)", ge=1)
  threshold: float | None = option(
      0.95, "confidence above which every mask of the block commits (if "
      "at least the step's share do)", ge=0, le=1,
      none="always the scheduled count")
  eos_early_stop: bool = option(False, "end the answer at a committed EOS "
                                "with no mask before it")
  temperature: float = draw_settings.TEMPERATURE.field(0.0)
  top_k: int | None = draw_settings.TOP_K.field()
  top_p: float | None = draw_settings.TOP_P.field()
  block_cache: bool = option(True, "run the current block against the "
                             "cached finished blocks (off: the whole "
                             "window each step, as the reference)")
  max_refills: int | None = max_refills()

  def __post_init__(self):
    options.check(self)

  @property
  def tail_length(self) -> int:
    """Room past gen_length for the last block's positions."""
    return self.block_length - 1

  @property
  def num_steps(self) -> int:
    blocks = math.ceil(self.gen_length / self.block_length) + 1
    return blocks * self.block_steps

  @property
  def block_steps(self) -> int:
    return min(self.steps, self.gen_length)  # the reference's minimal_topk 1

  def schedule(self) -> np.ndarray:
    """[block_steps] masks a step commits at least (the threshold aside)."""
    return np.asarray(commit_rules.even_counts(self.block_length,
                                               self.block_steps), np.int32)

  def own_sampling(self) -> Sampling:
    """The row settings this sampler's own options state."""
    return Sampling(temperature=self.temperature,
                    top_p=1.0 if self.top_p is None else self.top_p,
                    top_k=self.top_k or 0)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len,
                      tail=self.tail_length)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> BlockRows:
    p = tokens_BxN.shape[1] - self.gen_length - self.tail_length
    prompt_B = jnp.sum(model.valid_BxN[:, :p], axis=1, dtype=jnp.int32)
    zeros = jnp.zeros_like(prompt_B)
    cache = BlockCache.empty(model) if self.block_cache else None
    return BlockRows(prompt_B // self.block_length, zeros, zeros > 0, cache)

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

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    d = self.draw_block(model, state, rng_B, prompt_len)
    k_B = jnp.asarray(self.schedule())[jnp.minimum(d.aux.step_B,
                                                   self.block_steps - 1)]
    chosen_BxL = self.unmask(d, k_B, state.sampling)
    block_BxL = jnp.where(chosen_BxL, d.x0_BxL, d.block_BxL)
    tokens_BxN = d.write(block_BxL)
    eos_B = jnp.any(chosen_BxL & (d.x0_BxL == model.config.eos_token_id),
                    axis=1)
    rows = next_rows(model, d.aux, tokens_BxN, block_BxL, eos_B, d.start_B,
                     d.prompt_B, prompt_len, self.gen_length,
                     self.block_length, self.block_steps, self.eos_early_stop)
    return tokens_BxN, rows.replace(cache=d.cache), 1, d.logprobs()

  def draw_block(self, model: SequenceModel, state: DecodeState,
                 rng_B: jax.Array, prompt_len: int, with_logits: bool = False
                 ) -> "BlockDraw":
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

  def unmask(self, d: "BlockDraw", k_B: jax.Array, rows) -> jax.Array:
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
