"""Dream's Hugging Face tensor names: Qwen2's (qwen2_tensors.py)."""

from flash_dllm_jax.architectures.qwen2_tensors import TABLE

__all__ = ["TABLE"]
