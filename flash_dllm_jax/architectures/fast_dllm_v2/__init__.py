"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B; NVlabs/Fast-dLLM
`v2/`): Qwen2.5-7B-Instruct weights (GQA, q/k/v biases, untied head)
fine-tuned for block diffusion. Attention is bidirectional inside a block
and causal across blocks, blocks counted from the first prompt token
(modeling.py's eval_block_diff_mask); the logits row at position i
predicts position i + 1, as in the AR model it comes from (its decoding
shifts the block's logits by one).

config.json is read as the remote code's configuration.py reads it:
`bd_size` (the training block) is not the decoding block;
`conplemenrary_mask` (sic) is a training switch; `layer_types` must be all
full attention. The mask token is not in config.json: it is the
tokenizer's `mask_token` where named, else 151665 (`|<MASK>|`, the constant
of the remote code's generate and forward). Answers end at config.json's
eos_token_id, 151645 (`<|im_end|>`, the remote code's stop_token; the
tokenizer's EOS). The chat template and tensor names are Qwen2.5's
(architectures/qwen2_chat.py, qwen2_tensors.py, shared with Dream).
"""

from __future__ import annotations

from typing import Any

from flash_dllm_jax.architectures import Architecture, AttentionSpec
from flash_dllm_jax.architectures.qwen2_chat import CHAT_TEMPLATE

MASK_ID = 151665  # modeling.py's generate(mask_id=151665)

# Keys whose other values the genuine code builds differently, or that this
# engine does not implement.
_SUPPORTED = {"tie_word_embeddings": (False,), "hidden_act": ("silu",),
              "rope_scaling": (None,), "use_sliding_window": (False,)}


def read_hf_config(hf: dict[str, Any], special: dict[str, int] | None = None
                   ) -> dict[str, Any]:
  special = special or {}
  bad = [f"{k}={hf[k]!r}" for k, ok in _SUPPORTED.items()
         if k in hf and hf[k] not in ok]
  kinds = sorted(set(hf.get("layer_types") or ()) - {"full_attention"})
  if kinds:
    bad.append(f"layer_types={kinds!r}")
  if bad:
    raise ValueError("unsupported Fast-dLLM v2 config values: "
                     + ", ".join(bad))
  mask = hf.get("mask_token_id", special.get("mask_token_id", MASK_ID))
  if not 0 <= mask < hf["vocab_size"]:
    raise ValueError(f"Fast-dLLM v2 mask token id {mask} is outside the "
                     f"vocabulary of {hf['vocab_size']} (name the tokenizer's "
                     "mask_token)")
  eos = hf["eos_token_id"]
  n_heads = hf["num_attention_heads"]
  return dict(
      arch="fast_dllm_v2", vocab_size=hf["vocab_size"],
      d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
      n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
      mlp_hidden=hf["intermediate_size"], rms_norm_eps=hf["rms_norm_eps"],
      rope_theta=float(hf["rope_theta"]),
      max_seq_len=hf["max_position_embeddings"], mask_token_id=mask,
      eos_token_id=eos, pad_token_id=hf.get("pad_token_id", eos),
      bos_token_id=hf.get("bos_token_id"))


def _strategies():
  from flash_dllm_jax.architectures.fast_dllm_v2.strategies import STRATEGIES
  return STRATEGIES


def _name_table():
  from flash_dllm_jax.architectures.qwen2_tensors import TABLE
  return TABLE


SPEC = Architecture(
    name="fast_dllm_v2", hf_model_types=("fast_dllm_qwen",),
    label="Fast_dLLM_v2_7B", read_hf_config=read_hf_config,
    name_table=_name_table,
    attention=AttentionSpec(qkv_bias=True, rope_in_float32=False,
                            mask="block_causal"),
    logits_shift=1, default_strategy="fast-dllm-v2",
    samplers=("FastDLLMV2Sampler", "LLaDA2FlashSampler"),
    strategies=_strategies,
    chat_template=CHAT_TEMPLATE, likelihood_masks="count",
    presets={"fast-dllm-v2-7b": dict(
        vocab_size=152064, d_model=3584, n_layers=28, n_heads=28,
        n_kv_heads=4, head_dim=128, mlp_hidden=18944, rms_norm_eps=1e-6,
        rope_theta=1e6, max_seq_len=32768, mask_token_id=MASK_ID,
        eos_token_id=151645, pad_token_id=151645, bos_token_id=151643)},
    tiny_changes={"rms_norm_eps": 1e-6, "rope_theta": 1e6},
    tiny_special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                         "|<MASK>|"),
    tiny_tokenizer_config=dict(
        add_bos_token=False, eos_token="<|im_end|>",
        pad_token="<|endoftext|>", mask_token="|<MASK>|",
        chat_template=CHAT_TEMPLATE,
        additional_special_tokens=["|<MASK>|"]))
