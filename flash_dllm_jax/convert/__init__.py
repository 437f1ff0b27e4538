"""Conversion of Hugging Face LLaDA / Dream checkpoints to our format."""

from flash_dllm_jax.convert.converter import ConversionError, convert_checkpoint

__all__ = ["ConversionError", "convert_checkpoint"]
