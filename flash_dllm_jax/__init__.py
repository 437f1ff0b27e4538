"""flash-dllm-jax: fast inference for diffusion LLMs (LLaDA, Dream) in JAX.

  params, config, tokenizer = flash_dllm_jax.load("checkpoints/DIR")
  out = flash_dllm_jax.generate((params, config, tokenizer), "2 + 3 = ?",
                                chat=True, gen_length=64, steps=64)
"""

from flash_dllm_jax.checkpoint import load, save
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import GenerateOutput, generate
from flash_dllm_jax.sampling import DreamSampler, LLaDASampler

__all__ = ["DreamSampler", "GenerateOutput", "LLaDASampler", "ModelConfig",
           "generate", "load", "save"]
