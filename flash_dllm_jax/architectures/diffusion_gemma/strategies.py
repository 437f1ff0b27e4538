"""DiffusionGemma's own strategies: its official sampler (sampler.py) and
the variant that verifies confident rejected drafts in the next pass
(flash.py)."""

from flash_dllm_jax.architectures.diffusion_gemma.flash import (
    DiffusionGemmaFlashSampler)
from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("diffusion-gemma", DiffusionGemmaSampler,
             help="DiffusionGemma's official canvas sampler (self-"
                  "conditioned denoising, entropy-bound acceptance, early "
                  "stop), over an exact cache of prompt and canvases"),
    Strategy("diffusion-gemma-flash", DiffusionGemmaFlashSampler,
             help="the official canvas sampler, but drafts the entropy "
                  "bound rejects with probability >= gamma stay in the "
                  "canvas and are verified by the next pass's token-"
                  "stability check instead of being renoised"),
)
