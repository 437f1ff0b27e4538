"""Strategy `sdar`: SDAR's block diffusion (`block_diffusion_generate` of
JetAstra/SDAR's generate.py), every row at its own pace in one compiled
loop, over the exact cache of finished blocks.

Blocks of `block_length` are counted from each row's first prompt token;
the prompt's last, partial block is decoded with the first answer tokens.
Each step runs one forward of the row's current block and draws x0 and its
confidence x0_p (logits / temperature, then top_k, then top_p, then a draw
from the softmax; x0_p the drawn token's probability there). Among the
block's masks it commits, with k = the step's share of block_length spread
over denoising_steps (the first block_length % denoising_steps steps one
more):
  low_confidence_static   the k most confident;
  low_confidence_dynamic  every one with x0_p > confidence_threshold if
                          there are at least k of them, else the k most
                          confident;
  entropy_bounded         the masks in ascending order of their entropy,
                          as many as keep the running sum below eb_threshold
                          (at least one): JetEngine's rule (Labman42/
                          JetEngine scheduler.py), the entropy that of
                          softmax(logits / temperature).
A block ends when no mask is left (no forward is spent on it then) or
after denoising_steps steps; the answer ends after a block that leaves one
of the model's stop ids (EOS, end of turn) in it, or after the last block.

Model calls: one forward a step. The reference also spends one forward on
the prompt's whole blocks and one on each finished block (store_kv=True);
here the first step's forward writes the prompt's K/V and a block's final
K/V are written by the next step's forward (block_cache.py), so a row's
model calls are the reference's denoising forwards.

Deliberate differences from the reference: temperature 0 is greedy (argmax,
x0_p its softmax probability; the reference always samples, and divides by
a zero temperature); a step commits only masks (the reference's top-k over
-inf confidences overwrites committed tokens of the block when k exceeds
the masks left); the reference generate.py's entropy_bounded branch does
not run (transfer_index is unset and the entropy sums over the block), so
JetEngine's is the rule here. The reference's `sequential` remasking is not
offered.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.sampling import (blocks, commit_rules, draw_settings,
                                     options, select)
from flash_dllm_jax.sampling.block_steps import BlockSteps
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

REMASKING = ("low_confidence_static", "low_confidence_dynamic",
             "entropy_bounded")
_EPS = 1e-12  # JetEngine's clamp of probabilities before the log


@dataclasses.dataclass(frozen=True)
class SDARSampler:
  """The reference generate.py's arguments and command-line defaults, but
  temperature 0 (greedy, the engine's default draw and the setting SDAR's
  evaluation reports; the reference's is 1.0). top_k / top_p None: off
  (the reference's 0 / 1.0). block_cache: the exact cache of finished
  blocks (sampling/block_cache.py); max_refills: options.max_refills.
  temperature / top_k / top_p are also per row (`DecodeState.sampling`)."""

  row_fields: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k")

  gen_length: int = option(128, "answer tokens decoded", ge=1)
  block_length: int = option(4, "tokens per block (blocks counted from the "
                             "prompt's first token)", ge=1)
  denoising_steps: int = option(4, "steps a block is scheduled over", ge=1)
  remasking_strategy: str = option(
      "low_confidence_dynamic", "which masks a step commits: the scheduled "
      "count of the most confident (static), also every one above "
      "confidence_threshold (dynamic), or as many as keep the summed entropy "
      "under eb_threshold (entropy_bounded)", choices=REMASKING)
  confidence_threshold: float = option(
      0.85, "the dynamic rule's confidence threshold", ge=0, le=1,
      needs={"remasking_strategy": ("low_confidence_dynamic",)})
  eb_threshold: float = option(
      0.35, "the entropy-bounded rule's bound on a step's summed entropy",
      gt=0, needs={"remasking_strategy": ("entropy_bounded",)})
  temperature: float = draw_settings.TEMPERATURE.field(0.0)
  top_k: int | None = draw_settings.TOP_K.field()
  top_p: float | None = draw_settings.TOP_P.field()
  block_cache: bool = option(True, "run the current block against the "
                             "cached finished blocks (off: the whole window "
                             "each step, as the reference)")
  max_refills: int | None = max_refills()

  def __post_init__(self):
    options.check(self)

  # The block samplers' blocks, draws, cache and row handling, under SDAR's
  # names: its `steps` is denoising_steps, its `threshold` the dynamic
  # rule's confidence_threshold (None: the static rule's top-k alone).
  @property
  def steps(self) -> int:
    return self.denoising_steps

  @property
  def block_steps(self) -> int:
    return self.denoising_steps

  @property
  def threshold(self) -> float | None:
    if self.remasking_strategy == "low_confidence_dynamic":
      return self.confidence_threshold
    return None

  tail_length = BlockSteps.tail_length
  num_steps = BlockSteps.num_steps
  own_sampling = BlockSteps.own_sampling
  check_prompt = BlockSteps.check_prompt
  init_aux = BlockSteps.init_aux
  finished = BlockSteps.finished
  reset_rows = BlockSteps.reset_rows
  draw_block = BlockSteps.draw_block
  unmask = BlockSteps.unmask
  _draw = BlockSteps._draw
  _thresholds = BlockSteps._thresholds

  def schedule(self) -> np.ndarray:
    """[denoising_steps] masks each step commits (get_num_transfer_tokens)."""
    return np.asarray(commit_rules.even_counts(self.block_length,
                                               self.denoising_steps), np.int32)

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    d, logits_BxLxV = self.draw_block(model, state, rng_B, prompt_len,
                                      with_logits=True)
    k_B = jnp.asarray(self.schedule())[jnp.minimum(d.aux.step_B,
                                                   self.block_steps - 1)]
    if self.remasking_strategy == "entropy_bounded":
      chosen_BxL = self._entropy_bounded(d, logits_BxLxV, state.sampling)
    else:
      chosen_BxL = self.unmask(d, k_B, state.sampling)
    block_BxL = jnp.where(chosen_BxL, d.x0_BxL, d.block_BxL)
    tokens_BxN = d.write(block_BxL)
    no_eos_B = jnp.zeros_like(d.aux.stop_B)
    rows = blocks.next_rows(model, d.aux, tokens_BxN, block_BxL, no_eos_B,
                            d.start_B, d.prompt_B, prompt_len,
                            self.gen_length, self.block_length,
                            self.block_steps, eos_early_stop=False)
    rows = rows.replace(stop_B=rows.stop_B | self._stopped(
        model, d, tokens_BxN, block_BxL, prompt_len))
    return tokens_BxN, rows.replace(cache=d.cache), 1, d.logprobs()

  def _stopped(self, model, d: blocks.BlockDraw, tokens_BxN, block_BxL,
               prompt_len: int) -> jax.Array:
    """[B] the block is finished and the answer so far holds a stop id (the
    reference's stopping_criteria_idx: generation_config's EOS ids)."""
    if not model.stop_ids:
      return jnp.zeros_like(d.aux.stop_B)
    cfg = model.config
    done_B = ~jnp.any(block_BxL == cfg.mask_token_id, axis=1) | (
        d.aux.step_B + 1 >= self.block_steps)
    idx_N = jnp.arange(tokens_BxN.shape[1])
    answer_BxN = (idx_N >= prompt_len) & (
        idx_N < (d.start_B + self.block_length)[:, None])
    stop_BxN = jnp.isin(tokens_BxN, jnp.asarray(model.stop_ids))
    return done_B & jnp.any(answer_BxN & stop_BxN, axis=1)

  def _entropy_bounded(self, d: blocks.BlockDraw, logits_BxLxV: jax.Array,
                       rows) -> jax.Array:
    """[B, L] JetEngine's entropy-bounded choice among the block's masks."""
    t = (jnp.full((logits_BxLxV.shape[0],), self.temperature, jnp.float32)
         if rows is None else rows.temperature_B)
    scale_B = jnp.where(t > 0, t, 1.0)
    probs = jax.nn.softmax(
        logits_BxLxV.astype(jnp.float32) / scale_B[:, None, None], axis=-1)
    p = jnp.maximum(probs, _EPS)
    ent_BxL = -jnp.sum(p * jnp.log(p), axis=-1)
    ent_BxL = jnp.where(d.active_BxL, ent_BxL, jnp.inf)
    cum_BxL = jnp.cumsum(jnp.sort(ent_BxL, axis=1), axis=1)
    k_B = jnp.maximum(jnp.sum(cum_BxL < self.eb_threshold, axis=1), 1)
    return select.choose_top(jnp.where(d.active_BxL, -ent_BxL,
                                       select.NEG_INF), k_B)
