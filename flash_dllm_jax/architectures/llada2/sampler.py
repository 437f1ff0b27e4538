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
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.sampling import commit_rules, draw_settings, options
from flash_dllm_jax.sampling.block_steps import BlockSteps
from flash_dllm_jax.sampling.blocks import next_rows
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@dataclasses.dataclass(frozen=True)
class LLaDA2Sampler(BlockSteps):
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
  def block_steps(self) -> int:
    return min(self.steps, self.gen_length)  # the reference's minimal_topk 1

  def schedule(self) -> np.ndarray:
    """[block_steps] masks a step commits at least (the threshold aside)."""
    return np.asarray(commit_rules.even_counts(self.block_length,
                                               self.block_steps), np.int32)

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
