"""LLaDA2.x (inclusionAI/LLaDA2.0-mini, -flash, LLaDA2.1): a block-diffusion
MoE. GQA attention with QK-norm and RoPE on the first half of each head,
bidirectional inside a decode block and causal across blocks; a dense MLP
in the first `first_k_dense_replace` layers, then a sigmoid-routed,
group-limited mixture of experts with one shared expert.

config.json is read as inclusionAI's modeling_llada2_moe.py reads it. That
code ignores some of the keys the published configs carry, and so does this
reader: `norm_topk_prob` (the chosen weights are always renormalised when
more than one expert is chosen), `score_function` (always sigmoid),
`router_dtype` (the router always runs in float32),
`moe_router_enable_expert_bias` (the expert bias is always there),
`rotary_dim` (the rotated dims are int(head_dim * partial_rotary_factor)),
`norm_head` and the sliding-window keys. The config names no EOS or mask
token: they come from the tokenizer (<|endoftext|>, <|mask|>). LLaDA2.1's
config differs from 2.0's in max_position_embeddings only (32768); its
token editing is a decoding strategy (llada2.1).
"""

from __future__ import annotations

from typing import Any

from flash_dllm_jax.architectures import (Architecture, AttentionSpec,
                                          MissingToken)
from flash_dllm_jax.architectures.llada2.chat import CHAT_TEMPLATE
from flash_dllm_jax.moe_config import MoEConfig

# Keys the genuine code reads whose other values it builds differently (a
# bias on the fused q/k/v or the attention output, no QK-norm, tied
# embeddings) or that this engine does not implement.
_SUPPORTED = {"use_qkv_bias": (False,), "use_bias": (False,),
              "use_qk_norm": (True,), "tie_word_embeddings": (False,),
              "hidden_act": ("silu",), "rope_scaling": (None,)}


def read_hf_config(hf: dict[str, Any], special: dict[str, int] | None = None
                   ) -> dict[str, Any]:
  special = special or {}
  bad = [f"{k}={hf[k]!r}" for k, ok in _SUPPORTED.items()
         if k in hf and hf[k] not in ok]
  if hf.get("num_experts") is not None and not hf.get("num_shared_experts"):
    bad.append(f"num_shared_experts={hf.get('num_shared_experts')!r}")
  if bad:
    raise ValueError("unsupported LLaDA2 config values: " + ", ".join(bad))
  n_heads = hf["num_attention_heads"]
  moe = None
  if hf.get("num_experts") is not None:
    moe = MoEConfig(
        n_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"],
        hidden=hf["moe_intermediate_size"],
        n_shared=hf["num_shared_experts"],
        first_dense_layers=hf.get("first_k_dense_replace", 0),
        n_groups=hf.get("n_group", 1), topk_groups=hf.get("topk_group", 1),
        routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        norm_topk=True, score="sigmoid", expert_bias=True)
  eos = hf.get("eos_token_id", special.get("eos_token_id"))
  if eos is None:
    raise KeyError("eos_token_id")
  mask = hf.get("mask_token_id", special.get("mask_token_id"))
  if mask is None:
    raise MissingToken("the tokenizer has no mask token (LLaDA2's is "
                       "<|mask|>, an added token of tokenizer.json) and "
                       "config.json no mask_token_id")
  return dict(
      arch="llada2", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      n_layers=hf["num_hidden_layers"], n_heads=n_heads,
      n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
      mlp_hidden=hf.get("intermediate_size") or hf["moe_intermediate_size"],
      rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
      rope_theta=float(hf.get("rope_theta", 10000.0)),
      rope_fraction=float(hf.get("partial_rotary_factor", 0.5)),
      max_seq_len=hf.get("max_position_embeddings", 16384),
      mask_token_id=mask, eos_token_id=eos,
      pad_token_id=hf.get("pad_token_id", eos),
      bos_token_id=hf.get("bos_token_id", special.get("bos_token_id")),
      moe=moe)


def _name_table():
  from flash_dllm_jax.architectures.llada2.tensors import TABLE
  return TABLE


_MINI = dict(
    vocab_size=157184, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4,
    head_dim=128, mlp_hidden=5120, rms_norm_eps=1e-6, rope_theta=600000.0,
    rope_fraction=0.5, max_seq_len=16384, mask_token_id=156895,
    eos_token_id=156892, pad_token_id=156892,
    moe=MoEConfig(n_experts=256, top_k=8, hidden=512, n_shared=1,
                  first_dense_layers=1, n_groups=8, topk_groups=4,
                  routed_scaling=2.5))

# LLaDA2.0-flash (tests/reference/llada2-flash/config.json): 100.6B
# parameters, the mini's vocabulary, routing and RoPE at twice the width.
_FLASH = {**_MINI, "d_model": 4096, "n_layers": 32, "n_heads": 32,
          "mlp_hidden": 9216,
          "moe": MoEConfig(n_experts=256, top_k=8, hidden=1024, n_shared=1,
                           first_dense_layers=1, n_groups=8, topk_groups=4,
                           routed_scaling=2.5)}


def _strategies():
  from flash_dllm_jax.architectures.llada2.strategies import STRATEGIES
  return STRATEGIES


SPEC = Architecture(
    name="llada2", hf_model_types=("llada2_moe",),
    label="LLaDA2.0 / LLaDA2.1 mini and flash",
    read_hf_config=read_hf_config, name_table=_name_table,
    attention=AttentionSpec(qk_norm=True, rope_in_float32=False,
                            mask="block_causal"),
    logits_shift=0, default_strategy="llada2",
    samplers=("LLaDA2Sampler", "LLaDA21Sampler", "LLaDA2FlashSampler"),
    strategies=_strategies,
    chat_template=CHAT_TEMPLATE, likelihood_masks="count",
    presets={"llada2-mini": _MINI,
             "llada2.1-mini": {**_MINI, "max_seq_len": 32768},
             "llada2-flash": _FLASH},
    tiny_changes=dict(rms_norm_eps=1e-6, rope_theta=600000.0,
                      rope_fraction=0.5, moe=MoEConfig(
                          n_experts=8, top_k=2, hidden=32, n_shared=1,
                          first_dense_layers=1, n_groups=2, topk_groups=1,
                          routed_scaling=2.5)),
    tiny_special_tokens=("<role>", "</role>", "<|startoftext|>",
                         "<|endoftext|>", "<|role_end|>", "<|mask|>"),
    tiny_tokenizer_config=dict(
        add_bos_token=False, add_eos_token=False, bos_token="<|startoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE))
