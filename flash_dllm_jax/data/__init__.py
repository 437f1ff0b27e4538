"""Training data: the synthetic GSM8K-like corpus and the project tokenizer."""

from flash_dllm_jax.data.gsm_format import check_solution
from flash_dllm_jax.data.synthetic_gsm import generate

__all__ = ["check_solution", "generate"]
