"""Fast-dLLM v1 (NVlabs): block-wise decoding with a KV cache and parallel
commit rules, for LLaDA and Dream, batched in one compiled loop.

Each row decodes its generation block by block (semi-autoregressive). A
block's first step is a full forward; its logits decode that step, and with
a cache it also fills the row's KV cache. Later steps of the block run a
cached forward:
  prefix: queries are the block and every later position (the prefix
    [0, block start) is read from the cache);
  dual: queries are only the block; its fresh K/V overwrite its slots in
    place, the rest of the cache stays as the full forward left it.
Dream reads position i's logits from raw row i-1 (config.logits_shift), so
its cached queries start one position earlier: the block's first position
is predicted from the last token before the block, which is recomputed (and
its K/V slot rewritten) with the block.

Rows move through blocks at their own pace (threshold rules), so the block
index, the steps spent in it and the KV cache live per row in `aux`. A step
runs the full forward only when some row refreshes (lax.cond) and the cached
forward only when some row does not; each row takes its logits and cache
writes from exactly one of them, so a row's result does not depend on the
batch.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.sampling import checks, commit_rules, options
from flash_dllm_jax.sampling.options import option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState

CACHES = ("none", "prefix", "dual")


@struct.dataclass
class BlockState:
  """Per-row progress: block_B (current block), age_B (steps already spent
  in it), cache (KVCache, None without a cache)."""

  block_B: jax.Array
  age_B: jax.Array
  cache: object = None


@dataclasses.dataclass(frozen=True)
class FastDLLMSampler:
  """Fast-dLLM decoding (greedy; rows may sample, row_sampling.py).

  cache: 'none' (a full forward every step), 'prefix' or 'dual'.
  rule: the commit rule (commit_rules.py): 'threshold' (conf >= threshold,
    at least the top one), 'factor' (Fast-dLLM's factor rule with `factor`)
    or 'fixed' (LLaDA's even schedule of `steps` spread over the blocks).
  steps: used by 'fixed' (defaults to gen_length); the other rules only
    check it divides into the blocks, as the reference asserts.
  refresh_every: with a cache, also refresh it with a full forward every k
    steps inside a block (None: only at block start; 1: every step, which
    equals cache='none'); ignored without a cache.
  """

  row_fields: ClassVar[tuple[str, ...]] = (  # DecodeState.sampling
      "temperature", "top_p", "top_k", "threshold", "factor")

  gen_length: int = option(256, "answer tokens decoded", ge=1)
  block_length: int = option(32, "tokens per block (divides gen_length)",
                             ge=1)
  cache: str = option("dual", "KV cache: none, prefix (the blocks before), "
                      "dual (before and after)", choices=CACHES)
  rule: str = option("threshold", "commit rule: confidence threshold, "
                     "Fast-dLLM's factor rule, or a fixed schedule of steps",
                     choices=commit_rules.RULES)
  threshold: float = option(0.9, "confidence a mask needs to commit (rule "
                            "threshold; the most confident always does)",
                            gt=0, le=1, needs={"rule": ("threshold",)})
  factor: float = option(1.0, "Fast-dLLM's factor rule's factor", gt=0,
                         needs={"rule": ("factor",)})
  steps: int | None = option(None, "model steps of the fixed schedule over "
                             "the answer (a multiple of the number of "
                             "blocks)", ge=1, none="gen_length",
                             needs={"rule": ("fixed",)})
  refresh_every: int | None = option(
      None, "also refresh the cache with a full forward every k steps "
      "inside a block", ge=1, none="only at a block's start",
      needs={"cache": ("prefix", "dual")})

  def __post_init__(self):
    options.check(self)
    if self.steps is None:
      object.__setattr__(self, "steps", self.gen_length)
    options.check(self, lambda: checks.block_schedule_errors(
        self.gen_length, self.block_length, self.steps))

  @property
  def num_blocks(self) -> int:
    return self.gen_length // self.block_length

  @property
  def quirk(self) -> bool:
    """The reference's cached loops check for remaining masks only after a
    cached call, so a block finished by its block-start step still costs one
    cached call (which commits nothing). Not with refresh_every=1, where no
    cached call is ever made. One difference stays: when the final block is
    finished by its block-start step the row is complete and stops, so it
    spends one cached call (one forward) fewer than the reference."""
    return self.cache != "none" and self.refresh_every != 1

  @property
  def num_steps(self) -> int:
    """Every step commits at least one masked position, except a quirk step
    (at most one per block)."""
    steps = self.steps if self.rule == "fixed" else self.gen_length
    return steps + (self.num_blocks if self.quirk else 0)

  @property
  def commit_rule(self) -> commit_rules.CommitRule:
    """The rule's policy; 'fixed' counts a block's steps (LLaDA's schedule
    within each block)."""
    counts = commit_rules.even_counts(self.block_length,
                                      self.steps // self.num_blocks)
    return commit_rules.make(self.rule, threshold=self.threshold,
                             factor=self.factor, counts=counts)

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len,
                      needs_prompt="Fast-dLLM")

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> BlockState:
    b = tokens_BxN.shape[0]
    zeros_B = jnp.zeros((b,), jnp.int32)
    cache = None if self.cache == "none" else model.empty_cache()
    return BlockState(block_B=zeros_B, age_B=zeros_B, cache=cache)

  def _refreshes(self, age_B: jax.Array) -> jax.Array:
    if self.refresh_every is None:
      return age_B == 0
    return age_B % self.refresh_every == 0

  def _cached_queries(self, start_B: jax.Array, n: int, shift: int):
    """Query slots [B, Q] of a cached step (-1 past the sequence end). Q is
    static: prefix queries span gen_length whatever the block, so later
    blocks carry padding queries."""
    span = self.block_length if self.cache == "dual" else self.gen_length
    slots_BxQ = start_B[:, None] - shift + jnp.arange(span + shift)
    return jnp.where(slots_BxQ < n, slots_BxQ, -1)

  def block_logits(self, model: SequenceModel, tokens_BxN: jax.Array,
                   aux: BlockState, start_B: jax.Array, active_B: jax.Array):
    """(logits_BxLxV of the block's positions, new cache); each row's from
    exactly one forward, the full one iff it refreshes this step."""
    b, n = tokens_BxN.shape
    l, shift = self.block_length, model.config.logits_shift
    rows_BxL = start_B[:, None] - shift + jnp.arange(l)
    if self.cache == "none":
      return model.logits(tokens_BxN, rows_BxL), None
    refresh_B = active_B & self._refreshes(aux.age_B)
    cached_B = active_B & ~refresh_B
    no_logits = jnp.zeros((b, l, model.config.vocab_size), jnp.float32)
    skip = lambda cache: (no_logits, cache)

    def full(cache):  # only refreshing rows write (all N slots)
      slots_BxN = jnp.where(refresh_B[:, None], jnp.arange(n), -1)
      return model.cached(tokens_BxN, slots_BxN, cache, rows_BxL)

    def partial(cache):  # only the other rows write (their query slots)
      slots_BxQ = self._cached_queries(start_B, n, shift)
      tokens_BxQ = jnp.take_along_axis(tokens_BxN, jnp.maximum(slots_BxQ, 0),
                                       axis=1)
      slots_BxQ = jnp.where(cached_B[:, None], slots_BxQ, -1)
      rows_BxL = jnp.broadcast_to(jnp.arange(l), (b, l))
      return model.cached(tokens_BxQ, slots_BxQ, cache, rows_BxL)

    full_BxLxV, cache = jax.lax.cond(jnp.any(refresh_B), full, skip, aux.cache)
    part_BxLxV, cache = jax.lax.cond(jnp.any(cached_B), partial, skip, cache)
    return jnp.where(refresh_B[:, None, None], full_BxLxV, part_BxLxV), cache

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    aux, tokens_BxN = state.aux, state.tokens_BxN
    mask_id = model.config.mask_token_id
    active_B = ~state.done_B
    block_B = jnp.minimum(aux.block_B, self.num_blocks - 1)  # done rows
    start_B = prompt_len + block_B * self.block_length
    pos_BxL = start_B[:, None] + jnp.arange(self.block_length)

    logits_BxLxV, cache = self.block_logits(model, tokens_BxN, aux, start_B,
                                            active_B)
    x0_BxL, conf_BxL, lp_BxL = commit_rules.proposal(logits_BxLxV, state, rng_B,
                                               mask_id)
    block_BxL = jnp.take_along_axis(tokens_BxN, pos_BxL, axis=1)
    masked_BxL = block_BxL == mask_id
    chosen_BxL = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_BxL, masked_BxL, aux.age_B)
    block_BxL = jnp.where(chosen_BxL, x0_BxL.astype(block_BxL.dtype), block_BxL)
    tokens_BxN = jnp.put_along_axis(tokens_BxN, pos_BxL, block_BxL, axis=1,
                                    inplace=False)

    # Stay in the block while it has masks (and for the quirk's cached call).
    stay_B = jnp.any(block_BxL == mask_id, axis=1)
    if self.quirk:
      stay_B |= aux.age_B == 0
    age_B = jnp.where(stay_B, aux.age_B + 1, 0)
    new = BlockState(block_B=aux.block_B + (active_B & ~stay_B),
                     age_B=jnp.where(active_B, age_B, aux.age_B), cache=cache)
    logprob_BxN = jnp.put_along_axis(
        jnp.zeros(tokens_BxN.shape, jnp.float32), pos_BxL, lp_BxL, axis=1,
        inplace=False)
    # one forward per row
    return tokens_BxN, new, active_B.astype(jnp.int32), logprob_BxN
