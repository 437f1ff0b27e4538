"""LLaDA (GSAI-ML/LLaDA-8B-Instruct, LLaDA-1.5): a bidirectional Llama with
no biases, RoPE in float32, config.json in OLMo's keys."""

from __future__ import annotations

from typing import Any

from flash_dllm_jax.architectures import Architecture, AttentionSpec
from flash_dllm_jax.architectures.llada.chat import CHAT_TEMPLATE

# OLMo config keys whose other values this model does not implement.
_SUPPORTED = {
    "alibi": (False,), "block_type": ("llama",), "activation_type": ("silu",),
    "layer_norm_type": ("rms",), "include_bias": (False,),
    "include_qkv_bias": (False,), "attention_layer_norm": (False,),
    "weight_tying": (False,), "rope": (True,), "scale_logits": (False,),
    "input_emb_norm": (False,), "block_group_size": (1,),
}


def read_hf_config(hf: dict[str, Any], special: dict[str, int] | None = None
                   ) -> dict[str, Any]:
  bad = [f"{k}={hf[k]!r}" for k, ok in _SUPPORTED.items()
         if k in hf and hf[k] not in ok]
  if bad:
    raise ValueError("unsupported LLaDA config values: " + ", ".join(bad))
  n_heads = hf["n_heads"]
  n_kv = hf.get("n_kv_heads") or n_heads
  mlp_hidden = hf.get("mlp_hidden_size") or hf["mlp_ratio"] * hf["d_model"]
  return dict(
      arch="llada", vocab_size=hf.get("embedding_size") or hf["vocab_size"],
      d_model=hf["d_model"], n_layers=hf["n_layers"], n_heads=n_heads,
      n_kv_heads=n_kv, head_dim=hf["d_model"] // n_heads,
      mlp_hidden=mlp_hidden, rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
      rope_theta=float(hf.get("rope_theta", 10000.0)),
      max_seq_len=hf["max_sequence_length"],
      mask_token_id=hf["mask_token_id"], eos_token_id=hf["eos_token_id"],
      pad_token_id=hf.get("pad_token_id", hf["eos_token_id"]),
      bos_token_id=hf.get("bos_token_id"))


def _name_table():
  from flash_dllm_jax.architectures.llada.tensors import TABLE
  return TABLE


def _strategies():
  from flash_dllm_jax.architectures.llada.strategies import STRATEGIES
  return STRATEGIES


SPEC = Architecture(
    name="llada", hf_model_types=("llada",), label="LLaDA-8B, LLaDA-1.5",
    read_hf_config=read_hf_config, name_table=_name_table,
    attention=AttentionSpec(qkv_bias=False, rope_in_float32=True),
    logits_shift=0, default_strategy="llada",
    samplers=("LLaDASampler", "FastDLLMSampler", "FlashDLLMSampler",
              "FlashDLLMOnePassSampler",
              "ElasticCacheSampler"), strategies=_strategies,
    chat_template=CHAT_TEMPLATE, likelihood_masks="count",
    presets={"llada-8b": dict(
        vocab_size=126464, d_model=4096, n_layers=32, n_heads=32,
        n_kv_heads=32, head_dim=128, mlp_hidden=12288, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_seq_len=4096, mask_token_id=126336,
        eos_token_id=126081, pad_token_id=126081, bos_token_id=126080,
        eot_token_id=126348)},
    tiny_changes={"rms_norm_eps": 1e-5, "rope_theta": 500000.0},
    tiny_special_tokens=("<|startoftext|>", "<|endoftext|>", "<|eot_id|>",
                         "<|start_header_id|>", "<|end_header_id|>",
                         "<|mdm_mask|>"),
    tiny_tokenizer_config=dict(
        add_bos_token=False, add_eos_token=False, bos_token="<|startoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE))
