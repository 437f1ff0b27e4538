"""SDAR (JetLM/SDAR-4B-Chat, SDAR-8B-Chat, SDAR-30B-A3B-Chat; JetAstra/SDAR):
Qwen3 weights (GQA with QK-norm, no biases, untied head) trained for block
diffusion; SDAR-30B-A3B (model_type `sdar_moe`) is Qwen3-MoE's: each MLP a
softmax-routed mixture of experts (no shared expert, no expert bias).
Attention is bidirectional inside a block and causal across blocks, blocks
counted from the first prompt token; the logits row at position i predicts
position i (no shift). Decoded by strategy `sdar` (block_diffusion_generate
of the reference generate.py, over the exact cache of finished blocks),
and by `llada2-flash` (the same blocks, Flash-Verify of each step's drafts;
its answers end at <|endoftext|>, later blocks past an <|im_end|> are
decoded and cut off).

config.json is read as modeling_sdar.py reads it: `block_size` (the
training block) is not the decoding block (the sampler's block_length);
`attn_implementation`, `fuse_cross_entropy`, `micro_forward`, `ep_size`,
`use_deepep` and `debug` are training switches. Both EOS ids of
generation_config.json end an answer: <|endoftext|> (config eos_token_id)
and <|im_end|> (the tokenizer's end of turn). The mask token is
config.json's mask_token_id (151669, `<|MASK|>` in tokenizer_config.json;
SDAR-30B-A3B's config.json has none, its tokenizer's mask_token is it).

An sdar_moe config.json is read as modeling_sdar_moe.py builds its layers:
layer i has the MoE unless i is in `mlp_only_layers`, where num_experts > 0
and (i + 1) % decoder_sparse_step == 0; the others the dense MLP of width
intermediate_size. The router's softmax (float32) picks
num_experts_per_tok experts, their weights renormalised when
norm_topk_prob. `output_router_logits` and `router_aux_loss_coef` are
training switches.
"""

from __future__ import annotations

from typing import Any

from flash_dllm_jax.architectures import Architecture, AttentionSpec
from flash_dllm_jax.architectures.sdar.chat import CHAT_TEMPLATE
from flash_dllm_jax.moe_config import MoEConfig

# Keys whose other values the genuine code builds differently, or that this
# engine does not implement.
_SUPPORTED = {"attention_bias": (False,), "tie_word_embeddings": (False,),
              "hidden_act": ("silu",), "rope_scaling": (None,),
              "use_sliding_window": (False,)}


def read_hf_config(hf: dict[str, Any], special: dict[str, int] | None = None
                   ) -> dict[str, Any]:
  special = special or {}
  bad = [f"{k}={hf[k]!r}" for k, ok in _SUPPORTED.items()
         if k in hf and hf[k] not in ok]
  if bad:
    raise ValueError("unsupported SDAR config values: " + ", ".join(bad))
  mask = hf.get("mask_token_id", special.get("mask_token_id"))
  if mask is None:
    raise KeyError("mask_token_id")
  eos = hf["eos_token_id"]
  n_heads = hf["num_attention_heads"]
  moe = read_moe(hf) if hf.get("model_type") == "sdar_moe" else None
  return dict(
      arch="sdar", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      n_layers=hf["num_hidden_layers"], n_heads=n_heads,
      n_kv_heads=hf.get("num_key_value_heads") or n_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
      mlp_hidden=hf["intermediate_size"], rms_norm_eps=hf["rms_norm_eps"],
      rope_theta=float(hf["rope_theta"]),
      max_seq_len=hf["max_position_embeddings"], mask_token_id=mask,
      eos_token_id=eos, pad_token_id=hf.get("pad_token_id", eos),
      bos_token_id=hf.get("bos_token_id"), moe=moe)


def read_moe(hf: dict[str, Any]) -> MoEConfig | None:
  """The MoEConfig of an sdar_moe config.json (None where no layer has
  experts). This engine's MoE runs from one layer to the last, so the MoE
  layers must be such a run."""
  step, only = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers")
  if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
    raise ValueError(f"unsupported SDAR config values: decoder_sparse_step="
                     f"{step!r} (a positive int)")
  if only is not None and not (isinstance(only, list) and all(
      isinstance(i, int) and not isinstance(i, bool) for i in only)):
    raise ValueError(f"unsupported SDAR config values: mlp_only_layers="
                     f"{only!r} (a list of layer indices)")
  n, n_experts = hf["num_hidden_layers"], hf["num_experts"]
  moe_layers = [i for i in range(n) if i not in (only or ())
                and n_experts > 0 and (i + 1) % step == 0]
  if not moe_layers:
    return None
  first = moe_layers[0]
  if moe_layers != list(range(first, n)):
    raise ValueError(
        f"unsupported SDAR config values: decoder_sparse_step={step!r}, "
        f"mlp_only_layers={only!r} put the experts in layers {moe_layers}, "
        f"not in one run of layers to the last")
  top_k, norm = hf["num_experts_per_tok"], hf.get("norm_topk_prob", False)
  if norm and top_k == 1:  # model/moe.py's route keeps one expert's score
    raise ValueError("unsupported SDAR config values: norm_topk_prob=True "
                     "with num_experts_per_tok=1")
  return MoEConfig(n_experts=n_experts, top_k=top_k,
                   hidden=hf["moe_intermediate_size"], n_shared=0,
                   first_dense_layers=first, norm_topk=bool(norm),
                   score="softmax", expert_bias=False)


def _name_table():
  from flash_dllm_jax.architectures.sdar.tensors import TABLE
  return TABLE


def _strategies():
  from flash_dllm_jax.architectures.sdar.strategies import STRATEGIES
  return STRATEGIES


def _preset(d_model: int, mlp_hidden: int, n_layers: int = 36,
            n_kv_heads: int = 8, moe: MoEConfig | None = None
            ) -> dict[str, Any]:
  return dict(vocab_size=151936, d_model=d_model, n_layers=n_layers,
              n_heads=32, n_kv_heads=n_kv_heads, head_dim=128,
              mlp_hidden=mlp_hidden, moe=moe,
              rms_norm_eps=1e-6, rope_theta=1e6, max_seq_len=32768,
              mask_token_id=151669, eos_token_id=151643,
              pad_token_id=151643, bos_token_id=151643,
              eot_token_id=151645)


SPEC = Architecture(
    name="sdar", hf_model_types=("sdar", "sdar_moe"),
    label="SDAR-4B/8B-Chat, SDAR-30B-A3B-Chat",
    read_hf_config=read_hf_config, name_table=_name_table,
    attention=AttentionSpec(qk_norm=True, rope_in_float32=False,
                            mask="block_causal"),
    logits_shift=0, default_strategy="sdar",
    samplers=("SDARSampler", "LLaDA2FlashSampler"), strategies=_strategies,
    chat_template=CHAT_TEMPLATE, likelihood_masks="count",
    presets={"sdar-4b": _preset(2560, 9728), "sdar-8b": _preset(4096, 12288),
             "sdar-30b-a3b": _preset(2048, 6144, 48, 4, MoEConfig(
                 n_experts=128, top_k=8, hidden=768, score="softmax",
                 expert_bias=False))},
    tiny_changes={"rms_norm_eps": 1e-6, "rope_theta": 1e6},
    tiny_special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                         "<|MASK|>"),
    tiny_tokenizer_config=dict(
        add_bos_token=False, eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", mask_token="<|MASK|>",
        chat_template=CHAT_TEMPLATE,
        additional_special_tokens=["<|im_start|>", "<|im_end|>",
                                   "<|MASK|>"]))
