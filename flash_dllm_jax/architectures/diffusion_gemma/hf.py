"""DiffusionGemma's Hugging Face release: config.json (model_type
"diffusion_gemma", the backbone's fields under "text_config") and
safetensors shards, read into the official tree (tensors.from_hf), and
converted to Google's format (an orbax tree plus a config.json with
"transformer_config"), which `flash_dllm_jax.checkpoint.load` reads.

The config keys are the ones vLLM's gemma4.py reads (layer_types,
global_head_dim, num_global_key_value_heads, rope_parameters per layer
type, enable_moe_block, moe_intermediate_size, top_k_experts, ...). The
global layers' K=V is read from the weights (no v_proj), as vLLM's
DiffusionGemma model forces it. The rotated fraction of each head is
rope_parameters[layer type]["partial_rotary_factor"]: not checked against
a published config.json (none was available here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open

from flash_dllm_jax.architectures.diffusion_gemma import tensors
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    GEMMA4_SPECIAL, GLOBAL, LOCAL, GemmaConfig)

MODEL_TYPE = "diffusion_gemma"
_KINDS = {"sliding_attention": LOCAL, "full_attention": GLOBAL}


def is_hf_dir(d: Path) -> bool:
  cfg = d / "config.json"
  if not cfg.is_file():
    return False
  try:
    model_type = json.loads(cfg.read_text()).get("model_type")
  except json.JSONDecodeError:
    return False
  return str(model_type).lower() == MODEL_TYPE and bool(_shards(d))


def _shards(d: Path) -> list[Path]:
  index = d / "model.safetensors.index.json"
  if index.is_file():
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return [d / f for f in files]
  return sorted(d.glob("*.safetensors"))


def _names(d: Path) -> set[str]:
  names = set()
  for shard in _shards(d):
    with safe_open(shard, "numpy") as f:
      names.update(f.keys())
  return names


def read_config(hf: dict[str, Any], names: set[str] | None = None,
                dtype: str = "bfloat16") -> GemmaConfig:
  """GemmaConfig from a DiffusionGemma config.json (ValueError naming an
  unsupported value, or a missing key)."""
  t = hf.get("text_config", hf)
  bad = []
  if t.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
    bad.append(f"hidden_activation={t['hidden_activation']!r}")
  if float(t.get("rms_norm_eps", 1e-6)) != 1e-6:
    bad.append(f"rms_norm_eps={t['rms_norm_eps']!r}")
  if not t.get("tie_word_embeddings", hf.get("tie_word_embeddings", True)):
    bad.append("tie_word_embeddings=False")
  if t.get("hidden_size_per_layer_input"):
    bad.append(f"hidden_size_per_layer_input="
               f"{t['hidden_size_per_layer_input']}")
  if t.get("num_kv_shared_layers"):
    bad.append(f"num_kv_shared_layers={t['num_kv_shared_layers']}")
  if bad:
    raise ValueError("unsupported DiffusionGemma config values: "
                     + ", ".join(bad))
  try:
    kinds = tuple(_KINDS[k] for k in t["layer_types"])
  except KeyError as e:
    raise ValueError(f"config.json lacks or has an unknown {e.args[0]!r} "
                     "(layer_types: sliding_attention / full_attention)"
                     ) from None
  rope = t.get("rope_parameters", {})
  part = lambda kind: rope.get(kind, {})
  k_eq_v = bool(t.get("attention_k_eq_v", False))
  if names is not None and GLOBAL in kinds:
    first = kinds.index(GLOBAL)
    k_eq_v = not any(n.endswith(f"layers.{first}.self_attn.v_proj.weight")
                     for n in names)
  moe = bool(t.get("enable_moe_block") or t.get("use_second_mlp_block"))
  try:
    return GemmaConfig(
        vocab_size=t["vocab_size"], d_model=t["hidden_size"],
        mlp_hidden=t["intermediate_size"],
        sc_hidden=hf.get("self_conditioning_size") or t["intermediate_size"],
        n_heads=t["num_attention_heads"], head_dim=t["head_dim"],
        n_kv_heads=t["num_key_value_heads"], layer_kinds=kinds,
        sliding_window=t.get("sliding_window") or 1,
        final_logit_softcap=t.get("final_logit_softcapping"),
        attn_logits_softcap=t.get("attn_logit_softcapping"),
        n_global_kv_heads=t.get("num_global_key_value_heads"),
        global_head_dim=t.get("global_head_dim"), k_eq_v_global=k_eq_v,
        local_rope_fraction=float(part("sliding_attention").get(
            "partial_rotary_factor", 1.0)),
        global_rope_fraction=float(part("full_attention").get(
            "partial_rotary_factor", 1.0)),
        local_rope_base=float(part("sliding_attention").get(
            "rope_theta", t.get("rope_local_base_freq", 10_000.0))),
        global_rope_base=float(part("full_attention").get(
            "rope_theta", t.get("rope_theta", 10_000.0))),
        moe_experts=(t.get("num_experts") or 0) if moe else 0,
        moe_hidden=(t.get("moe_intermediate_size")
                    or t.get("expert_intermediate_size") or 0) if moe else 0,
        moe_top_k=t.get("top_k_experts", 8),
        max_seq_len=t.get("max_position_embeddings", 131072),
        eos_token_id=GEMMA4_SPECIAL["eos"], bos_token_id=GEMMA4_SPECIAL["bos"],
        end_of_turn_id=GEMMA4_SPECIAL["end_of_turn"],
        tool_response_id=GEMMA4_SPECIAL["begin_of_tool_response"],
        dtype=dtype)
  except KeyError as e:
    raise ValueError(f"config.json of model_type {MODEL_TYPE!r} lacks key "
                     f"{e.args[0]!r}") from None


def load_config(d: Path, dtype: str | None = None) -> GemmaConfig:
  hf = json.loads((d / "config.json").read_text())
  return read_config(hf, _names(d), dtype or "bfloat16")


def load(d: Path, dtype: str | None = None):
  """(official tree as numpy arrays in `dtype`, GemmaConfig)."""
  config = load_config(d, dtype)
  arrays = {}
  for shard in _shards(d):
    with safe_open(shard, "numpy") as f:
      for name in f.keys():
        if ".vision_tower." in name or ".embed_vision." in name:
          continue
        arrays[name] = f.get_tensor(name)
  try:
    params = tensors.from_hf(arrays, config)
  except KeyError as e:
    raise ValueError(f"{d} lacks tensor {e.args[0]!r}") from None
  np_dtype = np.dtype(config.dtype) if config.dtype != "bfloat16" else None
  if np_dtype is None:
    np_dtype = np.dtype(ml_dtypes.bfloat16)
  return jax.tree.map(lambda x: np.asarray(x).astype(np_dtype), params), config


def to_official(config: GemmaConfig) -> dict[str, Any]:
  """The "transformer_config" fields of `config` (config.from_official's
  inverse)."""
  kinds = {LOCAL: "LOCAL_SLIDING", GLOBAL: "GLOBAL"}
  moe = bool(config.moe_experts)
  return dict(
      num_embed=config.vocab_size, embed_dim=config.d_model,
      hidden_dim=config.sc_width, num_heads=config.n_heads,
      head_dim=config.head_dim, num_kv_heads=config.n_kv_heads,
      final_logit_softcap=config.final_logit_softcap,
      use_post_attn_norm=config.use_post_attn_norm,
      use_post_ffw_norm=config.use_post_ffw_norm,
      attention_types=[kinds[k] for k in config.layer_kinds],
      attn_logits_soft_cap=config.attn_logits_softcap,
      sliding_window_size=config.sliding_window,
      qk_norm_with_scale=config.qk_norm_with_scale,
      num_global_kv_heads=config.n_global_kv_heads,
      global_key_size=config.global_head_dim,
      k_eq_v_global=config.k_eq_v_global,
      global_rope_proportion=config.global_rope_fraction,
      local_rope_proportion=config.local_rope_fraction,
      local_base_frequency=config.local_rope_base,
      global_base_frequency=config.global_rope_base,
      local_scale_factor=config.local_rope_scale,
      global_scale_factor=config.global_rope_scale,
      enable_moe=moe, num_experts=config.moe_experts,
      expert_dim=config.moe_hidden, top_k_experts=config.moe_top_k,
      moe_dense_hidden_dim=config.mlp_hidden if moe else 0)
