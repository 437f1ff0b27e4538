"""SDAR's own strategy: its block diffusion (sampler.py)."""

from flash_dllm_jax.architectures.sdar.sampler import SDARSampler
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("sdar", SDARSampler,
             help="SDAR's block diffusion (remasking_strategy: static or "
                  "dynamic low-confidence, entropy-bounded) over an exact "
                  "cache of finished blocks"),
)
