"""Dream's own strategy (its reference sampler, sampler.py)."""

from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("dream", DreamSampler,
             help="Dream's reference sampler (no cache)"),
)
