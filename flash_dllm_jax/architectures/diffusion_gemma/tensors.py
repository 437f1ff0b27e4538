"""DiffusionGemma's Hugging Face safetensors names -> the official tree.

The names are vLLM's (vllm-project/vllm: DiffusionGemmaForConditional-
Generation.load_weights and models/gemma4.py): the backbone under
`model.encoder.language_model.layers.N.` (a tied copy under
`model.decoder.layers.N.`), `model.decoder.embed_tokens`,
`model.decoder.norm`, `model.decoder.self_conditioning.{pre_norm,
gate_proj,up_proj,down_proj}`, `lm_head` tied to the embedding. Per layer
`self_attn.{q,k,v,o}_proj` (no v_proj on K=V layers), `q_norm`/`k_norm`,
`input_layernorm`, `post_attention_layernorm`, the dense MLP `mlp.*` with
`pre_feedforward_layernorm` / `post_feedforward_layernorm_1`, the MoE
`router.{proj,scale,per_expert_scale}` and `experts.gate_up_proj`
[X, 2M, D] (gate rows first) / `experts.down_proj` [X, D, M] with
`pre_feedforward_layernorm_2` / `post_feedforward_layernorm_2`, the sum's
`post_feedforward_layernorm`, and `layer_scalar`. HF's "mlp" is the
official tree's dense `mlp2` and HF's experts its `mlp`.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from flash_dllm_jax.architectures.diffusion_gemma.config import GemmaConfig

TABLE = ()  # the engine's convert.tables rules: this family maps below
_LAYER_PREFIXES = ("model.encoder.language_model.layers.{i}.",
                   "model.language_model.layers.{i}.",
                   "model.decoder.layers.{i}.")
_TOP_PREFIXES = ("model.decoder.", "model.encoder.language_model.",
                 "model.language_model.")
# official norm name <- HF name, in an MoE layer (dense layer: mlp's).
_MOE_NORMS = {"pre_ffw2_norm": "pre_feedforward_layernorm",
              "post_ffw2_norm": "post_feedforward_layernorm_1",
              "pre_ffw_norm": "pre_feedforward_layernorm_2",
              "post_ffw1_norm": "post_feedforward_layernorm_2",
              "post_ffw_norm": "post_feedforward_layernorm"}
_DENSE_NORMS = {"pre_ffw_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}


def _heads(w_OxD, n: int) -> np.ndarray:
  """[n * H, D] (torch Linear rows) -> [n, D, H]."""
  o, d = w_OxD.shape
  return w_OxD.reshape(n, o // n, d).transpose(0, 2, 1)


def _mlp(get: Callable[[str], np.ndarray], p: str) -> dict:
  gate, up = get(p + "gate_proj.weight"), get(p + "up_proj.weight")
  return {"gating_einsum": np.stack([gate, up]),
          "linear": get(p + "down_proj.weight").T}


def from_hf(tensors: Mapping[str, np.ndarray], config: GemmaConfig) -> dict:
  """The official nested tree from HF-named arrays (a KeyError names the
  first tensor missing)."""
  def first(names):
    for n in names:
      if n in tensors:
        return np.asarray(tensors[n])
    raise KeyError(names[0])

  top = lambda name: first([p + name for p in _TOP_PREFIXES])
  params = {"embedder": {"input_embedding": top("embed_tokens.weight")},
            "final_norm": {"scale": top("norm.weight")}}
  sc = lambda name: first(["model.decoder.self_conditioning." + name,
                           "self_conditioning." + name])
  params["self_conditioner"] = {"pre_norm": {"scale": sc("pre_norm.weight")},
                                "ffw": _mlp(sc, "")}
  for i, kind in enumerate(config.layer_kinds):
    get = lambda name, i=i: first([p.format(i=i) + name
                                   for p in _LAYER_PREFIXES])
    kv = config.kv_heads(kind)
    attn = {"q_einsum": {"w": _heads(get("self_attn.q_proj.weight"),
                                     config.n_heads)},
            "attn_vec_einsum": {"w": get("self_attn.o_proj.weight").T.reshape(
                config.n_heads, config.key_size(kind), config.d_model)}}
    k = _heads(get("self_attn.k_proj.weight"), kv)
    if config.k_eq_v(kind):
      attn["k_einsum"] = {"w": k}
    else:
      attn["kv_einsum"] = {"w": np.stack(
          [k, _heads(get("self_attn.v_proj.weight"), kv)])}
    if config.qk_norm_with_scale:
      attn["query_norm"] = {"scale": get("self_attn.q_norm.weight")}
      attn["key_norm"] = {"scale": get("self_attn.k_norm.weight")}
    layer = {"attn": attn, "skip_scale": get("layer_scalar").reshape(1),
             "pre_attention_norm": {"scale": get("input_layernorm.weight")}}
    if config.use_post_attn_norm:
      layer["post_attention_norm"] = {
          "scale": get("post_attention_layernorm.weight")}
    norms = _MOE_NORMS if config.moe_experts else _DENSE_NORMS
    for ours, theirs in norms.items():
      if ours.startswith("post") and not config.use_post_ffw_norm:
        continue
      layer[ours] = {"scale": get(theirs + ".weight")}
    dense = _mlp(get, "mlp.")
    if not config.moe_experts:
      layer["mlp"] = dense
    else:
      x, m = config.moe_experts, config.moe_hidden
      layer["mlp2"] = dense
      layer["mlp"] = {
          "router_logits": {"w": get("router.proj.weight").T},
          "router_scale": get("router.scale"),
          "per_expert_scale": first([
              _LAYER_PREFIXES[0].format(i=i) + "router.per_expert_scale",
              _LAYER_PREFIXES[0].format(i=i) + "moe.per_expert_scale",
              _LAYER_PREFIXES[2].format(i=i) + "router.per_expert_scale"]),
          "gating_einsum": {"w": get("experts.gate_up_proj").reshape(
              x, 2, m, config.d_model)},
          "linear": {"w": get("experts.down_proj").transpose(0, 2, 1)}}
    params[f"layer_{i}"] = layer
  return params


def to_hf(params: Mapping, config: GemmaConfig) -> dict[str, np.ndarray]:
  """The HF-named arrays of an official tree (the inverse of from_hf,
  encoder names only, lm_head tied): to write test checkpoints."""
  a = lambda x: np.ascontiguousarray(np.asarray(x))
  out = {"model.decoder.embed_tokens.weight":
         a(params["embedder"]["input_embedding"]),
         "model.decoder.norm.weight": a(params["final_norm"]["scale"])}
  sc = params["self_conditioner"]
  out["model.decoder.self_conditioning.pre_norm.weight"] = a(
      sc["pre_norm"]["scale"])
  for name, w in _mlp_to_hf(sc["ffw"]).items():
    out["model.decoder.self_conditioning." + name] = w
  flat = lambda w: a(np.asarray(w).transpose(0, 2, 1).reshape(
      -1, config.d_model))
  for i, kind in enumerate(config.layer_kinds):
    lp, p = params[f"layer_{i}"], _LAYER_PREFIXES[0].format(i=i)
    at = lp["attn"]
    out[p + "self_attn.q_proj.weight"] = flat(at["q_einsum"]["w"])
    out[p + "self_attn.o_proj.weight"] = a(np.asarray(
        at["attn_vec_einsum"]["w"]).reshape(-1, config.d_model).T)
    if "k_einsum" in at:
      out[p + "self_attn.k_proj.weight"] = flat(at["k_einsum"]["w"])
    else:
      out[p + "self_attn.k_proj.weight"] = flat(at["kv_einsum"]["w"][0])
      out[p + "self_attn.v_proj.weight"] = flat(at["kv_einsum"]["w"][1])
    for ours, theirs in (("query_norm", "q_norm"), ("key_norm", "k_norm")):
      if ours in at:
        out[p + f"self_attn.{theirs}.weight"] = a(at[ours]["scale"])
    out[p + "layer_scalar"] = a(lp["skip_scale"])
    out[p + "input_layernorm.weight"] = a(lp["pre_attention_norm"]["scale"])
    if "post_attention_norm" in lp:
      out[p + "post_attention_layernorm.weight"] = a(
          lp["post_attention_norm"]["scale"])
    norms = _MOE_NORMS if config.moe_experts else _DENSE_NORMS
    for ours, theirs in norms.items():
      if ours in lp:
        out[p + theirs + ".weight"] = a(lp[ours]["scale"])
    dense = lp["mlp2"] if config.moe_experts else lp["mlp"]
    for name, w in _mlp_to_hf(dense).items():
      out[p + "mlp." + name] = w
    if config.moe_experts:
      m = lp["mlp"]
      out[p + "router.proj.weight"] = a(np.asarray(m["router_logits"]["w"]).T)
      out[p + "router.scale"] = a(m["router_scale"])
      out[p + "router.per_expert_scale"] = a(m["per_expert_scale"])
      g = np.asarray(m["gating_einsum"]["w"])
      out[p + "experts.gate_up_proj"] = a(g.reshape(g.shape[0], -1,
                                                    g.shape[-1]))
      out[p + "experts.down_proj"] = a(np.asarray(
          m["linear"]["w"]).transpose(0, 2, 1))
  return out


def _mlp_to_hf(p) -> dict[str, np.ndarray]:
  g = np.asarray(p["gating_einsum"])
  return {"gate_proj.weight": np.ascontiguousarray(g[0]),
          "up_proj.weight": np.ascontiguousarray(g[1]),
          "down_proj.weight": np.ascontiguousarray(np.asarray(p["linear"]).T)}
