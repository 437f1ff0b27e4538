"""LLaDA and Dream as one Flax transformer, plus its KV cache."""

from flash_dllm_jax.model.cache import KVCache
from flash_dllm_jax.model.transformer import Transformer, init_params

__all__ = ["KVCache", "Transformer", "init_params"]
