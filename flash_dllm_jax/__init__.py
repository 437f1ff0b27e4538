"""flash-dllm-jax: fast inference for diffusion LLMs in JAX (the model
families are the registry's: `flash_dllm_jax.architectures.names()`).

  model = flash_dllm_jax.load("checkpoints/DIR")   # (params, config, tokenizer)
  out = flash_dllm_jax.generate(model, "2 + 3 = ?", strategy="flash-dllm",
                                gen_length=64)
  out.texts[0]
"""

from flash_dllm_jax.checkpoint import load, save
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.forward import ForwardOutput, logits
from flash_dllm_jax.generate import GenerateOutput, generate
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.strategies import STRATEGIES, build_sampler

__all__ = ["DreamSampler", "ForwardOutput", "GenerateOutput", "LLaDASampler",
           "ModelConfig", "STRATEGIES", "build_sampler", "generate",
           "logits", "load", "save"]
