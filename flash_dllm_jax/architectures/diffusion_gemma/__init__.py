"""DiffusionGemma (google-deepmind/gemma, `gemma/diffusion/`): Gemma 4
26B-A4B turned into a canvas denoiser. Local sliding-window and global
layers (5:1; global layers with their own key size and kv heads, K=V,
partial RoPE), query/key norms and no 1/sqrt(d), an MoE beside a dense
shared MLP, tied embeddings with a final softcap, and a self-conditioning
block on the canvas inputs. Text only.

Its configuration (config.py: GemmaConfig, the 26B-A4B preset) and
forward (model.py, layers.py over the official parameter tree) are its
own; checkpoints load through `flash_dllm_jax.checkpoint.load` (Google's
orbax checkpoint: checkpoint.py).
"""

from __future__ import annotations

from flash_dllm_jax.architectures import Architecture, AttentionSpec
from flash_dllm_jax.architectures.diffusion_gemma.chat import CHAT_TEMPLATE
from flash_dllm_jax.architectures.diffusion_gemma.config import ARCH


def read_hf_config(hf, special=None):
  raise ValueError(
      "DiffusionGemma's Hugging Face config does not map onto ModelConfig: "
      "load the checkpoint directory with flash_dllm_jax.checkpoint.load")


def _name_table():
  from flash_dllm_jax.architectures.diffusion_gemma.tensors import TABLE
  return TABLE


def loader():
  """The module that claims and loads this family's checkpoints."""
  from flash_dllm_jax.architectures.diffusion_gemma import checkpoint
  return checkpoint


def _strategies():
  from flash_dllm_jax.architectures.diffusion_gemma.strategies import STRATEGIES
  return STRATEGIES


SPEC = Architecture(
    name=ARCH, hf_model_types=("diffusion_gemma",),
    label="DiffusionGemma (google-deepmind)",
    read_hf_config=read_hf_config, name_table=_name_table,
    attention=AttentionSpec(qk_norm=True, mask="full"),
    logits_shift=0, default_strategy="diffusion-gemma",
    samplers=("DiffusionGemmaSampler", "DiffusionGemmaFlashSampler"),
    strategies=_strategies,
    chat_template=CHAT_TEMPLATE,
    likelihood_masks="count", presets={}, tiny_changes={},
    tiny_special_tokens=("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>"),
    tiny_tokenizer_config=dict(
        add_bos_token=True, add_eos_token=False, bos_token="<bos>",
        eos_token="<eos>", pad_token="<pad>", chat_template=CHAT_TEMPLATE),
    loader=loader)
