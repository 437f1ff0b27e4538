"""A preallocated KV cache as an explicit pytree updated by pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig
from pallas_kernels.attention import kv_quant

# kv_cache_dtype values: "auto" (the model's dtype) or an 8-bit format.
KV_CACHE_DTYPES = ("auto", *kv_quant.FORMAT_MAX)


def kv_cache_dtype_error(value) -> str | None:
  """Why `value` is no kv_cache_dtype, or None."""
  if value not in KV_CACHE_DTYPES:
    return (f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
            f"got {value!r}")
  return None


def cache_bytes(config: ModelConfig, positions: int,
                kv_cache_dtype: str = "auto") -> int:
  """Bytes of one row's KVCache over `positions` slots (every layer's K and
  V, and an 8-bit cache's scales)."""
  dtype = jnp.dtype(config.dtype if kv_cache_dtype == "auto"
                    else kv_cache_dtype)
  per_head = config.head_dim * dtype.itemsize
  if kv_quant.is_quantized(dtype):
    per_head += jnp.dtype(kv_quant.SCALE_DTYPE).itemsize
  return 2 * config.n_layers * positions * config.n_kv_heads * per_head


@struct.dataclass
class KVCache:
  """Post-RoPE keys and values of every layer, one buffer per layer.

  k[l], v[l]: [B, S, K, D]. Slot s holds the token at absolute position s.
  Buffers are per layer (not stacked) so that each layer's write aliases its
  own buffer when the cache is donated to a jitted step.
  k_scale[l], v_scale[l]: [B, S, K] bfloat16, an 8-bit cache's scale per
  slot and KV head (pallas_kernels/attention/kv_quant.py); None otherwise.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  k_scale: tuple[jax.Array, ...] | None = None
  v_scale: tuple[jax.Array, ...] | None = None

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, length: int,
            dtype=None) -> "KVCache":
    """dtype: None or "auto" (the model's), or an 8-bit format."""
    if length > config.max_seq_len:
      raise ValueError(f"cache length {length} exceeds the model's "
                       f"max_seq_len {config.max_seq_len}")
    dtype = jnp.dtype(config.dtype if dtype in (None, "auto") else dtype)
    shape = (batch, length, config.n_kv_heads, config.head_dim)
    buffers = lambda shp, dt: tuple(jnp.zeros(shp, dt)
                                    for _ in range(config.n_layers))
    if not kv_quant.is_quantized(dtype):
      return cls(k=buffers(shape, dtype), v=buffers(shape, dtype))
    return cls(k=buffers(shape, dtype), v=buffers(shape, dtype),
               k_scale=buffers(shape[:3], kv_quant.SCALE_DTYPE),
               v_scale=buffers(shape[:3], kv_quant.SCALE_DTYPE))

  @property
  def length(self) -> int:
    return self.k[0].shape[1]

  @property
  def quantized(self) -> bool:
    return self.k_scale is not None

  def layer(self, i: int) -> tuple[jax.Array, ...]:
    """Layer i's buffers: (k, v), or (k, v, k_scale, v_scale) when 8-bit."""
    if self.quantized:
      return self.k[i], self.v[i], self.k_scale[i], self.v_scale[i]
    return self.k[i], self.v[i]

  @classmethod
  def from_layers(cls, layers) -> "KVCache":
    """The cache of per-layer tuples as `layer` returns them."""
    parts = tuple(zip(*layers))
    return cls(*parts) if len(parts) == 4 else cls(parts[0], parts[1])

  def write(self, layer: int, k_BxQxKxD: jax.Array, v_BxQxKxD: jax.Array,
            positions_BxQ: jax.Array) -> "KVCache":
    """Returns a cache whose layer `layer` holds the new rows (-1 = skip)."""
    if self.quantized:
      raise ValueError("KVCache.write takes no 8-bit cache (the model's "
                       "cached forward writes it)")
    k = list(self.k)
    v = list(self.v)
    k[layer] = ops.write_cache(k[layer], k_BxQxKxD, positions_BxQ)
    v[layer] = ops.write_cache(v[layer], v_BxQxKxD, positions_BxQ)
    return KVCache(k=tuple(k), v=tuple(v))
