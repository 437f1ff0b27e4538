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

Temperature 0 is greedy (argmax, the confidence its softmax probability):
LLaDA2.1's rule. LLaDA2.0's code samples from softmax(logits) at every
temperature, 0 included; temperature 1 does that here. Above 0: logits / T,
then top_k and top_p, then a draw from the softmax with each row's own key,
the confidence the drawn token's probability. Deliberate difference: only
the answer's EOS counts (the reference's early stop also looks at the
prompt, which here holds left padding).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flash_dllm_jax.sampling import checks, commit_rules, select
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@struct.dataclass
class BlockRows:
  """Per row: its current block (counted from its first prompt token), the
  steps spent in it, and whether its answer has ended."""

  block_B: jax.Array
  step_B: jax.Array
  stop_B: jax.Array


@dataclasses.dataclass(frozen=True)
class LLaDA2Sampler:
  """The reference `generate`'s arguments and defaults (gen_length aside)."""

  gen_length: int = 128
  block_length: int = 32
  steps: int = 32
  threshold: float | None = 0.95
  eos_early_stop: bool = False
  temperature: float = 0.0
  top_k: int | None = None
  top_p: float | None = None

  def __post_init__(self):
    checks.check_finite(self)
    errors = []
    for name in ("gen_length", "block_length", "steps"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        errors.append(f"{name} must be a positive int, got {value!r}")
    if self.threshold is not None and not 0 <= self.threshold <= 1:
      errors.append(f"threshold must be None or in [0, 1], got "
                    f"{self.threshold}")
    if self.temperature < 0:
      errors.append(f"temperature must be >= 0, got {self.temperature}")
    errors += checks.optional_positive_errors(self, "top_k")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      errors.append(f"top_p must be None or in (0, 1], got {self.top_p}")
    if not isinstance(self.eos_early_stop, bool):
      errors.append(f"eos_early_stop must be a bool, got "
                    f"{self.eos_early_stop!r}")
    if errors:
      raise ValueError("invalid LLaDA2 sampler arguments: "
                       + "; ".join(errors))

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

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length + self.tail_length,
                      max_seq_len)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> BlockRows:
    p = tokens_BxN.shape[1] - self.gen_length - self.tail_length
    prompt_B = jnp.sum(model.valid_BxN[:, :p], axis=1, dtype=jnp.int32)
    zeros = jnp.zeros_like(prompt_B)
    return BlockRows(prompt_B // self.block_length, zeros, zeros > 0)

  def finished(self, model, tokens_BxN, aux: BlockRows, prompt_len):
    return aux.stop_B

  def _draw(self, logits_BxLxV: jax.Array, rng_B: jax.Array):
    """(tokens_BxL, confidence_BxL) as the reference samples them."""
    if self.temperature == 0:
      x0_BxL = jnp.argmax(logits_BxLxV, axis=-1)
      return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)
    if self.temperature != 1:
      logits_BxLxV = logits_BxLxV / self.temperature
    if self.top_k is not None:
      logits_BxLxV = select.top_k_filter(logits_BxLxV, self.top_k)
    if self.top_p is not None and self.top_p < 1:
      logits_BxLxV = select.top_p_filter(logits_BxLxV, self.top_p)
    x0_BxL = select.row_categorical(rng_B, logits_BxLxV)
    return x0_BxL, select.prob_of(logits_BxLxV, x0_BxL)

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    cfg, aux, bl = model.config, state.aux, self.block_length
    tokens_BxN = state.tokens_BxN
    b, n = tokens_BxN.shape
    prompt_B = jnp.sum(model.valid_BxN[:, :prompt_len], axis=1,
                       dtype=jnp.int32)
    start_B = aux.block_B * bl + prompt_len - prompt_B  # the current block, in the canvas
    rows_BxL = start_B[:, None] + jnp.arange(bl)
    logits_BxLxV = model.logits(tokens_BxN, rows_BxL, block_length=bl)
    x0_BxL, p_BxL = self._draw(logits_BxLxV, rng_B)
    block_BxL = jnp.take_along_axis(tokens_BxN, rows_BxL, axis=1)
    active_BxL = block_BxL == cfg.mask_token_id
    conf_BxL = jnp.where(active_BxL, p_BxL, select.NEG_INF)
    k_B = jnp.asarray(self.schedule())[jnp.minimum(aux.step_B,
                                                   self.block_steps - 1)]
    chosen_BxL = select.choose_top(conf_BxL, k_B)
    if self.threshold is not None:
      high_BxL = active_BxL & (conf_BxL > self.threshold)
      enough_B = jnp.sum(high_BxL, axis=1) >= k_B
      chosen_BxL = jnp.where(enough_B[:, None], high_BxL, chosen_BxL)
    block_BxL = jnp.where(chosen_BxL, x0_BxL.astype(block_BxL.dtype),
                          block_BxL)
    tokens_BxN = tokens_BxN.at[jnp.arange(b)[:, None], rows_BxL].set(
        block_BxL)
    return tokens_BxN, self._bookkeep(model, aux, tokens_BxN, block_BxL,
                                      chosen_BxL, x0_BxL, start_B, prompt_B,
                                      prompt_len), 1

  def _bookkeep(self, model, aux: BlockRows, tokens_BxN, block_BxL,
                chosen_BxL, x0_BxL, start_B, prompt_B,
                prompt_len) -> BlockRows:
    """The rows' next block and step, and which answers have ended."""
    cfg, bl = model.config, self.block_length
    n = tokens_BxN.shape[1]
    step_B = aux.step_B + 1
    block_done_B = ~jnp.any(block_BxL == cfg.mask_token_id, axis=1) | (
        step_B >= self.block_steps)
    idx_N = jnp.arange(n)
    answer_BxN = (idx_N >= prompt_len) & (idx_N < (start_B + bl)[:, None])
    eos_BxN = answer_BxN & (tokens_BxN == cfg.eos_token_id)
    stop_B = aux.stop_B
    if model.stop_ids:
      stop_B = stop_B | (block_done_B & jnp.any(eos_BxN, axis=1))
      if self.eos_early_stop:
        committed_B = jnp.any(chosen_BxL & (x0_BxL == cfg.eos_token_id), 1)
        first_B = jnp.argmax(eos_BxN, axis=1)
        before_BxN = answer_BxN & (idx_N < first_B[:, None])
        clear_B = ~jnp.any(before_BxN & (tokens_BxN == cfg.mask_token_id), 1)
        stop_B = stop_B | (committed_B & clear_B)
    block_B = aux.block_B + block_done_B
    ends_B = -(-(prompt_B + self.gen_length) // bl)  # the row's block count
    stop_B = stop_B | (block_B >= ends_B)
    return BlockRows(block_B, jnp.where(block_done_B, 0, step_B), stop_B)
