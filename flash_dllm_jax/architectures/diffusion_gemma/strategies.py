"""DiffusionGemma's own strategy (its official sampler, sampler.py)."""

from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("diffusion-gemma", DiffusionGemmaSampler,
             help="DiffusionGemma's official canvas sampler (self-"
                  "conditioned denoising, entropy-bound acceptance, early "
                  "stop), over an exact cache of prompt and canvases"),
)
