"""The transformer every architecture is composed from, plus its KV cache."""

from flash_dllm_jax.model.cache import KVCache
from flash_dllm_jax.model.transformer import CachedExtras, Transformer, init_params

__all__ = ["CachedExtras", "KVCache", "Transformer", "init_params"]
