"""The model as samplers see it: one batch of sequences with fixed padding.

Built inside the jitted decode from the params and the batch's padding; it
gives every strategy the same two forwards, uncached and cached, so none of
them deals with positions, padding masks or the Flax module itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import KVCache, Transformer


@dataclasses.dataclass(frozen=True)
class SequenceModel:
  """params, plus the batch's RoPE positions and key validity [B, N]."""

  config: ModelConfig
  params: object
  positions_BxN: jax.Array
  valid_BxN: jax.Array

  @classmethod
  def for_batch(cls, config: ModelConfig, params,
                valid_BxN: jax.Array) -> "SequenceModel":
    """RoPE positions count from each row's first real token, so a row's
    result does not depend on how much left padding its batch needs."""
    positions_BxN = jnp.maximum(jnp.cumsum(valid_BxN, axis=1) - 1, 0)
    return cls(config, params, positions_BxN, valid_BxN)

  @property
  def _module(self) -> Transformer:
    return Transformer(self.config)

  def logits(self, tokens_BxN: jax.Array, rows_BxR: jax.Array) -> jax.Array:
    """Uncached forward over the whole sequence; logits [B, R, V] of rows."""
    logits, _ = self._module.apply(
        {"params": self.params}, tokens_BxN, self.positions_BxN,
        self.valid_BxN, logit_rows_BxR=rows_BxR)
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
    positions_BxQ = jnp.take_along_axis(self.positions_BxN,
                                        jnp.maximum(slots_BxQ, 0), axis=1)
    return self._module.apply(
        {"params": self.params}, tokens_BxQ, positions_BxQ, self.valid_BxN,
        cache=cache, slots_BxQ=slots_BxQ, logit_rows_BxR=rows_BxR)
