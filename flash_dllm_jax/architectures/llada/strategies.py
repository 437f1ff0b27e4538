"""LLaDA's own strategy (its reference sampler, sampler.py)."""

from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("llada", LLaDASampler,
             help="LLaDA's reference sampler (semi-AR blocks, no cache)"),
)
