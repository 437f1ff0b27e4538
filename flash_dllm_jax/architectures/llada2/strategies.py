"""LLaDA2.x's own strategies: its block sampler (sampler.py), LLaDA2.1's
editing (sampler21.py). Flash-Verify inside blocks, llada2-flash, decodes
the other block-causal families too: sampling/block_flash.py."""

from flash_dllm_jax.architectures.llada2.sampler import LLaDA2Sampler
from flash_dllm_jax.architectures.llada2.sampler21 import (MODES,
                                                           LLaDA21Sampler)
from flash_dllm_jax.sampling.strategy import Strategy

STRATEGIES = (
    Strategy("llada2", LLaDA2Sampler,
             help="LLaDA2's block-diffusion sampler (threshold or schedule "
                  "per block) over an exact cache of finished blocks"),
    Strategy("llada2.1", LLaDA21Sampler, fixed={"steps": 32},
             help="LLaDA2.1's decoding: threshold unmasking (M2T) plus "
                  "editing of committed tokens (T2T), exact block cache"),
    Strategy("llada2.1-speed", LLaDA21Sampler,
             fixed={"steps": 32, **MODES["speed"]},
             help="llada2.1 in LLaDA2.1's speed mode (threshold "
                  "0.5, editing_threshold 0.0, max_post_steps 16)"),
    Strategy("llada2.1-quality", LLaDA21Sampler,
             fixed={"steps": 32, **MODES["quality"]},
             help="llada2.1 in LLaDA2.1's quality mode (threshold "
                  "0.7, editing_threshold 0.5, max_post_steps 16)"),
)
