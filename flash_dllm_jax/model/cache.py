"""A preallocated KV cache as an explicit pytree updated by pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig


@struct.dataclass
class KVCache:
  """Post-RoPE keys and values of every layer, one buffer per layer.

  k[l], v[l]: [B, S, K, D]. Slot s holds the token at absolute position s.
  Buffers are per layer (not stacked) so that each layer's write aliases its
  own buffer when the cache is donated to a jitted step.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, length: int,
            dtype=None) -> "KVCache":
    if length > config.max_seq_len:
      raise ValueError(f"cache length {length} exceeds the model's "
                       f"max_seq_len {config.max_seq_len}")
    dtype = dtype or jnp.dtype(config.dtype)
    shape = (batch, length, config.n_kv_heads, config.head_dim)
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers)),
               v=tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers)))

  @property
  def length(self) -> int:
    return self.k[0].shape[1]

  def write(self, layer: int, k_BxQxKxD: jax.Array, v_BxQxKxD: jax.Array,
            positions_BxQ: jax.Array) -> "KVCache":
    """Returns a cache whose layer `layer` holds the new rows (-1 = skip)."""
    k = list(self.k)
    v = list(self.v)
    k[layer] = ops.write_cache(k[layer], k_BxQxKxD, positions_BxQ)
    v[layer] = ops.write_cache(v[layer], v_BxQxKxD, positions_BxQ)
    return KVCache(k=tuple(k), v=tuple(v))
