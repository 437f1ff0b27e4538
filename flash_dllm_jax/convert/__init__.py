"""Conversion of Hugging Face checkpoints (every registered family's name
table) to our format."""

from flash_dllm_jax.convert.converter import ConversionError, convert_checkpoint

__all__ = ["ConversionError", "convert_checkpoint"]
