"""Fast-dLLM v2's own strategy: its sub-block decoding (sampler.py)."""

from flash_dllm_jax.architectures.fast_dllm_v2.sampler import (
    FastDLLMV2Sampler)
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("fast-dllm-v2", FastDLLMV2Sampler,
             help="Fast-dLLM v2's decoding (sub-blocks, confidence "
                  "threshold, optional sub-block cache) over an exact cache "
                  "of finished blocks"),
)
