"""The compiled loop, its state and the strategies that decode several
families. A family's own sampler lives in its folder
(flash_dllm_jax/architectures/<family>/sampler*.py)."""

from flash_dllm_jax.sampling.elastic_cache import ElasticCacheSampler
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.sampling.loop import (EndsRows, Refillable, Sampler,
                                          make_step, run_compiled, run_python)
from flash_dllm_jax.sampling.state import DecodeState

__all__ = ["DecodeState", "ElasticCacheSampler", "EndsRows",
           "FastDLLMSampler", "Refillable", "Sampler", "make_step",
           "run_compiled", "run_python"]
