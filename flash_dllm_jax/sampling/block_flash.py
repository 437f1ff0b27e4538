"""Flash-Verify inside the blocks of a block-diffusion family (LLaDA2.x,
SDAR, Fast-dLLM v2; strategy llada2-flash).

Each step drafts the row's current block with one forward against the
exact cache of finished blocks (block_cache.py), commits the drafts its
rule accepts (rule "threshold": every mask with confidence >= threshold,
and always the most confident one, as Flash-dLLM and Fast-dLLM do;
"factor": Fast-dLLM's factor rule), then verifies up to block_length // 2
of the remaining drafts, most confident first, in a second pass that does
not write the cache (flash_verify.plan): the block's other positions as
they stand, each candidate as a draft row and as a mask row, over the
cached finished blocks; mask row i sees the drafts before it, so its
probability of draft i is "draft i given the earlier drafts". The longest
prefix whose cumulative probability stays >= gamma is committed too. A
block ends when no mask is left in it; answers end as in LLaDA2Sampler
(after a block holding EOS, or with eos_early_stop at a committed EOS with
no mask before it). forwards_B counts both passes.

A family whose logits row i predicts position i + 1 (config.logits_shift,
Fast-dLLM v2) drafts block position j from row j - 1 of the block forward,
the block's first position from the previous block's last row
(block_logits' shift), and its verify pass reads each candidate's
probability from a predictor row at the slot before it
(flash_verify.plan); a predictor row before the block sees only the
cache, as the block-causal mask has it.

Drafts are greedy, or drawn per row from `DecodeState.sampling` as
Flash-dLLM draws them (row_sampling.propose_tokens: temperature, top_k,
then top_p); a row's own threshold, factor and gamma replace the
sampler's in its rule and verify pass (row_options.py). A draft
committed by the rule reports its log-probability under the model's
softmax; a verified one the verify pass's probability of it, as
Flash-dLLM does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from flash_dllm_jax.sampling import (blocks, checks, commit_rules,
                                     flash_verify, options)
from flash_dllm_jax.sampling.block_cache import block_logits
from flash_dllm_jax.sampling.blocks import BlockRows
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

RULES = ("threshold", "factor")


@dataclasses.dataclass(frozen=True)
class LLaDA2FlashSampler:
  """Block drafts, Flash-Verify of the rest; LLaDA2's blocks and stops.

  rule / threshold / factor: the draft's commit rule (commit_rules.py).
  gamma: the verify pass's acceptance level (Flash-dLLM's).
  A row's own temperature / top_p / top_k (its draft, Flash-dLLM's
  row sampling) and threshold, factor and gamma are row data
  (`DecodeState.sampling`; row_options.py).
  block_cache: False runs the whole window every step (the exactness
    reference: same tokens and model calls).
  max_refills: as LLaDA2Sampler's.
  """

  row_fields: ClassVar[tuple[str, ...]] = (
      "temperature", "top_p", "top_k", "threshold", "factor", "gamma")

  gen_length: int = option(128, "answer tokens decoded", ge=1)
  block_length: int = option(32, "tokens per block (blocks counted from "
                             "the prompt's first token; the verify checks "
                             "half of one)", ge=2)
  rule: str = option("threshold", "the draft's commit rule: confidence "
                     "threshold or Fast-dLLM's factor rule", choices=RULES)
  threshold: float = option(0.9, "confidence a draft needs to commit (the "
                            "most confident always does)", gt=0, le=1,
                            needs={"rule": ("threshold",)})
  factor: float = option(1.0, "Fast-dLLM's factor rule's factor", gt=0,
                         needs={"rule": ("factor",)})
  gamma: float = option(0.8, "Flash-Verify's acceptance level", gt=0, le=1)
  eos_early_stop: bool = option(False, "end the answer at a committed EOS "
                                "with no mask before it")
  block_cache: bool = option(True, "run the current block against the "
                             "cached finished blocks (off: the whole "
                             "window each step, the exactness reference)")
  max_refills: int | None = max_refills()

  def __post_init__(self):
    options.check(self)

  @property
  def tail_length(self) -> int:
    return self.block_length - 1

  @property
  def num_steps(self) -> int:
    """Every step commits one mask at least: a block's masks at most."""
    blocks = math.ceil(self.gen_length / self.block_length) + 1
    return blocks * self.block_length

  @property
  def commit_rule(self) -> commit_rules.CommitRule:
    return commit_rules.make(self.rule, threshold=self.threshold,
                             factor=self.factor)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len,
                      tail=self.tail_length)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> BlockRows:
    return blocks.first_rows(model, tokens_BxN, self.gen_length,
                             self.tail_length, self.block_length)

  def finished(self, model, tokens_BxN, aux: BlockRows, prompt_len):
    return aux.stop_B

  def reset_rows(self, aux: BlockRows, rows_B: jax.Array) -> BlockRows:
    return blocks.reset_rows(aux, rows_B)

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    cfg, l = model.config, self.block_length
    tokens_BxN = state.tokens_BxN
    rows_Bx1 = jnp.arange(tokens_BxN.shape[0])[:, None]
    aux, prompt_B, start_B = blocks.current_block(model, state.aux,
                                                  prompt_len, l)
    pos_BxL = start_B[:, None] + jnp.arange(l)
    active_B = ~state.done_B
    bc = aux.cache if self.block_cache else aux.cache.reset_rows(active_B)
    logits_BxLxV, bc = block_logits(model, tokens_BxN, bc, start_B, active_B,
                                    l, cfg.logits_shift)
    x0_BxL, conf_BxL, lp_BxL = commit_rules.proposal(
        logits_BxLxV, state, rng_B, cfg.mask_token_id)
    x0_BxL = x0_BxL.astype(tokens_BxN.dtype)
    block_BxL = tokens_BxN[rows_Bx1, pos_BxL]
    masked_BxL = block_BxL == cfg.mask_token_id
    commit_BxL = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_BxL, masked_BxL)
    block_BxL = jnp.where(commit_BxL, x0_BxL, block_BxL)
    tokens_BxN = tokens_BxN.at[rows_Bx1, pos_BxL].set(block_BxL)
    v = self.verify_block(model, tokens_BxN, bc.cache, pos_BxL, start_B,
                          x0_BxL, conf_BxL,
                          masked_BxL & ~commit_BxL & active_B[:, None],
                          commit_rules.row_value(state, "gamma", self.gamma))
    keep_BxL = v.keep_BxL
    lp_BxL = jnp.where(keep_BxL, jnp.log(v.p_BxL), lp_BxL)
    block_BxL = jnp.where(keep_BxL, x0_BxL, block_BxL)
    tokens_BxN = tokens_BxN.at[rows_Bx1, pos_BxL].set(block_BxL)
    eos_B = jnp.any((commit_BxL | keep_BxL) & (x0_BxL == cfg.eos_token_id),
                    axis=1)
    rows = blocks.next_rows(model, aux, tokens_BxN, block_BxL, eos_B,
                            start_B, prompt_B, prompt_len, self.gen_length,
                            l, l, self.eos_early_stop)
    logprob_BxN = jnp.zeros(tokens_BxN.shape, jnp.float32).at[
        rows_Bx1, pos_BxL].set(lp_BxL)
    return (tokens_BxN, rows.replace(cache=bc),
            1 + v.ran_B.astype(jnp.int32), logprob_BxN)

  def verify_block(self, model, tokens_BxN, cache, pos_BxL, start_B, x0_BxL,
                   conf_BxL, eligible_BxL, gamma=None) -> "BlockVerify":
    """The verify pass over the drafts x0_BxL of the eligible block
    positions pos_BxL (tokens_BxN: the block after the draft's commits;
    cache: final before start_B; gamma: [B] the rows' levels, None: the
    sampler's)."""
    b, n = tokens_BxN.shape
    l = self.block_length
    rows_Bx1 = jnp.arange(b)[:, None]
    order_BxC, slots_BxC, drafts_BxC, n_cand_B = flash_verify.candidates(
        pos_BxL, x0_BxL, conf_BxL, eligible_BxL, l // 2)
    real_BxC = slots_BxC >= 0
    idx_N = jnp.arange(n)
    block_BxN = (idx_N >= start_B[:, None]) & (idx_N < start_B[:, None] + l)
    cand_BxN = jnp.zeros((b, n), bool).at[
        rows_Bx1, jnp.where(real_BxC, slots_BxC, n)].set(True, mode="drop")
    recent_BxN = jnp.where(block_BxN & ~cand_BxN, 0.0, -jnp.inf)
    plan = flash_verify.plan(tokens_BxN, recent_BxN, slots_BxC, drafts_BxC,
                             n_cand_B, l, model.config.mask_token_id,
                             model.config.logits_shift)
    # A predictor row before the block (shift: the first position's) sees
    # none of the block, as the block-causal mask has it.
    plan = plan._replace(inq_BxQxQ=plan.inq_BxQxQ & (
        plan.slots_BxQ >= start_B[:, None])[:, :, None])
    # The cache is final before the block; the block's own slots are stale.
    hidden_BxS = plan.exclude_BxS | (idx_N >= start_B[:, None])
    p_BxC = flash_verify.run_pass(model, plan, cache, drafts_BxC, hidden_BxS)
    keep_BxC = flash_verify.accept(
        p_BxC, plan.S_B, self.gamma if gamma is None else gamma)
    at_BxC = jnp.where(keep_BxC, order_BxC, l)
    keep_BxL = jnp.zeros((b, l), bool).at[rows_Bx1, at_BxC].set(
        True, mode="drop")
    p_BxL = jnp.ones((b, l), jnp.float32).at[rows_Bx1, at_BxC].set(
        p_BxC, mode="drop")
    return BlockVerify(keep_BxL, plan.S_B > 0, p_BxC, slots_BxC, drafts_BxC,
                       p_BxL)


class BlockVerify(NamedTuple):
  """keep_BxL: the drafts committed; ran_B: rows the pass checked; p_BxC:
  each candidate's probability given the earlier ones, slots_BxC (-1 =
  none) and drafts_BxC: the candidates, most confident first; p_BxL: the
  kept drafts' p at their block position (1 elsewhere)."""

  keep_BxL: jax.Array
  ran_B: jax.Array
  p_BxC: jax.Array
  slots_BxC: jax.Array
  drafts_BxC: jax.Array
  p_BxL: jax.Array | None = None
