"""The model as samplers see it: one batch of sequences with fixed padding.

Built inside the jitted decode from the params and the batch's padding; it
gives every strategy the same two forwards, uncached and cached, so none of
them deals with positions, padding masks or the Flax module itself.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import traverse_util

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import CachedExtras, KVCache, Transformer


@dataclasses.dataclass(frozen=True)
class SequenceModel:
  """params, plus the batch's RoPE positions and key validity [B, N].

  implementation: kernel choice for the cached path (flash_dllm_jax/ops/).
  stop_ids: the tokens that end an answer in this decode (empty when every
    position is decoded), for strategies that drop positions after a stop.
  """

  config: ModelConfig
  params: object
  positions_BxN: jax.Array
  valid_BxN: jax.Array
  implementation: str | None = None
  stop_ids: tuple[int, ...] = ()

  @classmethod
  def for_batch(cls, config: ModelConfig, params, valid_BxN: jax.Array,
                implementation: str | None = None,
                stop_ids: tuple[int, ...] = ()) -> "SequenceModel":
    """RoPE positions count from each row's first real token, so a row's
    result does not depend on how much left padding its batch needs."""
    positions_BxN = jnp.maximum(jnp.cumsum(valid_BxN, axis=1) - 1, 0)
    return cls(config, params, positions_BxN, valid_BxN, implementation,
               tuple(stop_ids))

  @property
  def _module(self) -> Transformer:
    return Transformer(self.config, implementation=self.implementation)

  def logits(self, tokens_BxN: jax.Array, rows_BxR: jax.Array,
             block_length: int | None = None) -> jax.Array:
    """Uncached forward over the whole sequence; logits [B, R, V] of rows.
    block_length: block-causal families' decode block (blocks counted from
    each row's first token)."""
    blocks_BxN = (None if block_length is None
                  else self.positions_BxN // block_length)
    logits, _ = self._module.apply(
        {"params": self.params}, tokens_BxN, self.positions_BxN,
        self.valid_BxN, logit_rows_BxR=rows_BxR, blocks_BxQ=blocks_BxN,
        block_length=block_length)
    return logits

  def empty_cache(self, dtype=None) -> KVCache:
    b, n = self.valid_BxN.shape
    return KVCache.zeros(self.config, b, n, dtype)

  def cached(self, tokens_BxQ: jax.Array, slots_BxQ: jax.Array,
             cache: KVCache, rows_BxR: jax.Array | None = None
             ) -> tuple[jax.Array, KVCache]:
    """Forward of the tokens at absolute slots (-1 = padding query) against
    the cache: their K/V are written at those slots first, then they attend
    over every valid slot. Returns (logits [B, R, V], updated cache)."""
    out = self.run(tokens_BxQ, slots_BxQ, cache, rows_BxR)
    return out.logits, out.cache

  def block_cached(self, tokens_BxQ: jax.Array, slots_BxQ: jax.Array,
                   cache: KVCache, rows_BxR: jax.Array, block_length: int
                   ) -> tuple[jax.Array, KVCache]:
    """Block-causal cached forward: the tokens' K/V are written at their
    slots (-1 = padding query), then each query attends to the valid slots
    of its block and earlier ones, as in `logits(..., block_length)`.
    Returns (logits [B, R, V], updated cache)."""
    positions_BxQ = jnp.take_along_axis(self.positions_BxN,
                                        jnp.maximum(slots_BxQ, 0), axis=1)
    (logits, new_cache) = self._module.apply(
        {"params": self.params}, tokens_BxQ, positions_BxQ, self.valid_BxN,
        cache=cache, slots_BxQ=slots_BxQ, logit_rows_BxR=rows_BxR,
        blocks_BxQ=positions_BxQ // block_length,
        key_blocks_BxS=self.positions_BxN // block_length,
        block_length=block_length)
    return logits, new_cache

  def run(self, tokens_BxQ: jax.Array, slots_BxQ: jax.Array, cache: KVCache,
          rows_BxR: jax.Array | None = None,
          extras: CachedExtras | None = None,
          mass_from_layer: int = 0) -> "CachedOutput":
    """The general cached forward (see CachedExtras): verify passes that do
    not write the cache, hidden slots, in-query keys, and the attention mass
    per slot summed over layers >= mass_from_layer."""
    positions_BxQ = jnp.take_along_axis(self.positions_BxN,
                                        jnp.maximum(slots_BxQ, 0), axis=1)
    (logits, new_cache), state = self._module.apply(
        {"params": self.params}, tokens_BxQ, positions_BxQ, self.valid_BxN,
        cache=cache, slots_BxQ=slots_BxQ, logit_rows_BxR=rows_BxR,
        extras=extras, mass_from_layer=mass_from_layer,
        mutable=["intermediates"])
    masses = [v for path, v in traverse_util.flatten_dict(
        state.get("intermediates", {})).items() if path[-1] == "attention_mass"]
    mass_BxS = None
    if masses:
      mass_BxS = sum(m for group in masses for m in group)
    return CachedOutput(logits, new_cache, mass_BxS)


class CachedOutput(NamedTuple):
  """logits [B, R, V]; the cache after the forward; mass [B, S] or None."""

  logits: jax.Array
  cache: KVCache
  mass_BxS: jax.Array | None
