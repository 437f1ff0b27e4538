"""Samplers (decoding policies) and the compiled loop that runs them."""

from flash_dllm_jax.sampling.dream import DreamSampler
from flash_dllm_jax.sampling.elastic_cache import ElasticCacheSampler
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.sampling.llada import LLaDASampler
from flash_dllm_jax.sampling.llada2 import LLaDA2Sampler
from flash_dllm_jax.sampling.llada2_flash import LLaDA2FlashSampler
from flash_dllm_jax.sampling.llada21 import LLaDA21Sampler
from flash_dllm_jax.sampling.loop import (EndsRows, Refillable, Sampler,
                                          make_step, run_compiled, run_python)
from flash_dllm_jax.sampling.state import DecodeState

__all__ = ["DecodeState", "DreamSampler", "ElasticCacheSampler", "EndsRows",
           "FastDLLMSampler", "LLaDA21Sampler", "LLaDA2FlashSampler", "LLaDA2Sampler", "LLaDASampler", "Refillable", "Sampler",
           "make_step",
           "run_compiled", "run_python"]
