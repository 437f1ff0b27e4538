"""Dream (Dream-org/Dream-v0-Instruct-7B): Qwen2.5 weights with q/k/v
biases, run bidirectionally; position i is predicted by logits row i-1."""

from __future__ import annotations

from typing import Any

from flash_dllm_jax.architectures import Architecture, AttentionSpec
from flash_dllm_jax.architectures.dream.chat import CHAT_TEMPLATE


def read_hf_config(hf: dict[str, Any], special: dict[str, int] | None = None
                   ) -> dict[str, Any]:
  bad = []
  if hf.get("tie_word_embeddings", False):
    bad.append("tie_word_embeddings=True")
  if hf.get("rope_scaling") is not None:
    bad.append(f"rope_scaling={hf['rope_scaling']!r}")
  if hf.get("use_sliding_window", False):
    bad.append("use_sliding_window=True")
  if hf.get("hidden_act", "silu") != "silu":
    bad.append(f"hidden_act={hf['hidden_act']!r}")
  if bad:
    raise ValueError("unsupported Dream config values: " + ", ".join(bad))
  n_heads = hf["num_attention_heads"]
  return dict(
      arch="dream", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      n_layers=hf["num_hidden_layers"], n_heads=n_heads,
      n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
      mlp_hidden=hf["intermediate_size"], rms_norm_eps=hf["rms_norm_eps"],
      rope_theta=float(hf["rope_theta"]),
      max_seq_len=hf["max_position_embeddings"],
      mask_token_id=hf["mask_token_id"], eos_token_id=hf["eos_token_id"],
      pad_token_id=hf.get("pad_token_id", hf["eos_token_id"]),
      bos_token_id=hf.get("bos_token_id"))


def _name_table():
  from flash_dllm_jax.architectures.dream.tensors import TABLE
  return TABLE


def _strategies():
  from flash_dllm_jax.architectures.dream.strategies import STRATEGIES
  return STRATEGIES


SPEC = Architecture(
    name="dream", hf_model_types=("dream",), label="Dream-v0",
    read_hf_config=read_hf_config, name_table=_name_table,
    attention=AttentionSpec(qkv_bias=True, rope_in_float32=False),
    logits_shift=1, default_strategy="dream",
    samplers=("DreamSampler", "FastDLLMSampler", "FlashDLLMSampler",
              "FlashDLLMOnePassSampler",
              "ElasticCacheSampler"), strategies=_strategies,
    chat_template=CHAT_TEMPLATE, likelihood_masks="rate",
    presets={"dream-7b": dict(
        vocab_size=152064, d_model=3584, n_layers=28, n_heads=28,
        n_kv_heads=4, head_dim=128, mlp_hidden=18944, rms_norm_eps=1e-6,
        rope_theta=1e6, max_seq_len=131072, mask_token_id=151666,
        eos_token_id=151643, pad_token_id=151643, bos_token_id=151643,
        eot_token_id=151645)},
    tiny_changes={"rms_norm_eps": 1e-6, "rope_theta": 1e6},
    tiny_special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                         "<|beginoftext|>", "<|mask|>"),
    tiny_tokenizer_config=dict(
        add_bos_token=False, bos_token="<|beginoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        mask_token="<|mask|>", chat_template=CHAT_TEMPLATE,
        additional_special_tokens=["<|beginoftext|>", "<|mask|>"]),
    tiny_bos_is_eos=True)
