"""The synthetic GSM8K-like corpus and the project tokenizer (training data
of the shipped model; imports the inference package, never the reverse)."""

from flash_dllm_data.gsm_format import check_solution
from flash_dllm_data.synthetic_gsm import generate

__all__ = ["check_solution", "generate"]
