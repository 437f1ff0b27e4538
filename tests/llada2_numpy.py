"""NumPy oracle of LLaDA2MoeModelLM (inclusionAI remote code, model_type
`llada2_moe`): the forward pass as equations, for tests only.

Restated from the published remote code (see /work/notes/llada2_spec.md for
the line-level sources): pre-norm decoder, fused query_key_value, per-head
RMSNorm on q and k, partial rotary embedding (first int(head_dim *
partial_rotary_factor) dims, rotate-half layout), a dense SwiGLU MLP for the
first `first_k_dense_replace` layers and then a sigmoid-routed MoE with
expert_bias used for the choice only, group-limited top-k (group score = sum
of the group's two best biased scores), renormalised weights times
routed_scaling_factor, and shared experts. Computed in float64 by default;
the remote code runs bf16 with the router in fp32.
"""

from __future__ import annotations

import numpy as np

# LLaDA2MoeConfig defaults for the keys the modeling code reads.
CONFIG_DEFAULTS = dict(
    vocab_size=30592, hidden_size=1024, intermediate_size=None,
    num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=0,
    hidden_act="silu", use_qkv_bias=False, use_qk_norm=True, use_bias=True,
    rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0,
    rope_scaling=None, num_experts=16, num_shared_experts=0,
    num_experts_per_tok=2, n_group=8, topk_group=4, routed_scaling_factor=2.5,
    moe_intermediate_size=None, first_k_dense_replace=0, head_dim=None,
    partial_rotary_factor=0.5)


def resolve_config(config: dict) -> dict:
  """The config as the remote code sees it: class defaults filled in,
  head_dim = head_dim or hidden_size // num_attention_heads."""
  cfg = {**CONFIG_DEFAULTS, **config}
  cfg["head_dim"] = cfg["head_dim"] or (cfg["hidden_size"]
                                        // cfg["num_attention_heads"])
  if cfg["hidden_act"] != "silu":
    raise ValueError(f"hidden_act {cfg['hidden_act']!r}: only silu is "
                     "restated")
  rope = cfg["rope_scaling"] or {}
  if rope.get("rope_type", rope.get("type", "default")) != "default":
    raise ValueError(f"rope_scaling {rope!r}: only default RoPE is restated")
  return cfg


def rms_norm(x, w, eps):
  """w * x / sqrt(mean(x^2) + eps) over the last axis."""
  return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x):
  return x / (1.0 + np.exp(-x))


def rotary_dim(cfg: dict) -> int:
  return int(cfg["head_dim"] * cfg["partial_rotary_factor"])


def rope_cos_sin(positions_BxN, rot: int, theta: float, dtype=np.float64):
  """cos, sin [B, N, rot]: inv_freq_i = theta^(-2i/rot), i < rot/2, and the
  angle table is concatenated with itself (cat(freqs, freqs))."""
  inv_freq = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
  ang = positions_BxN[..., None].astype(np.float64) * inv_freq
  ang = np.concatenate([ang, ang], axis=-1)
  return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def apply_rope(x_BxNxHxD, cos_BxNxR, sin_BxNxR):
  """Rotates the first R dims (rotate_half: (x1, x2) -> (-x2, x1) on the two
  halves of those R dims); dims R: pass through unchanged."""
  r = cos_BxNxR.shape[-1]
  rot, rest = x_BxNxHxD[..., :r], x_BxNxHxD[..., r:]
  x1, x2 = rot[..., :r // 2], rot[..., r // 2:]
  half = np.concatenate([-x2, x1], axis=-1)
  cos, sin = cos_BxNxR[:, :, None, :], sin_BxNxR[:, :, None, :]
  return np.concatenate([rot * cos + half * sin, rest], axis=-1)


def block_causal_mask(n: int, block_length: int) -> np.ndarray:
  """bool [N, N]: query i may see key j iff j // block_length <= i //
  block_length (bidirectional inside a block, causal across blocks; blocks
  counted from position 0, prompt included)."""
  blk = np.arange(n) // block_length
  return blk[None, :] <= blk[:, None]


def _linear(x, w, prefix, bias: bool):
  y = x @ w[prefix + ".weight"].T
  return y + w[prefix + ".bias"] if bias else y


def attention(x_BxNxE, w, p, cfg, bias_BxNxN, cos, sin):
  """Fused QKV -> q/k RMSNorm over head_dim -> partial RoPE -> GQA softmax
  attention with an additive bias -> dense."""
  b, n, _ = x_BxNxE.shape
  nh, nkv, d = (cfg["num_attention_heads"], cfg["num_key_value_heads"],
                cfg["head_dim"])
  qkv = _linear(x_BxNxE, w, p + "attention.query_key_value",
                cfg["use_qkv_bias"]).reshape(b, n, nh + 2 * nkv, d)
  q, k, v = qkv[:, :, :nh], qkv[:, :, nh:nh + nkv], qkv[:, :, nh + nkv:]
  if cfg["use_qk_norm"]:
    eps = cfg["rms_norm_eps"]
    q = rms_norm(q, w[p + "attention.query_layernorm.weight"], eps)
    k = rms_norm(k, w[p + "attention.key_layernorm.weight"], eps)
  q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
  rep = nh // nkv  # query head h reads kv head h // rep (repeat_kv)
  k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) * d ** -0.5 + bias_BxNxN[:, None]
  s = s - s.max(-1, keepdims=True)
  pr = np.exp(s)
  pr = pr / pr.sum(-1, keepdims=True)
  o = np.einsum("bhqk,bkhd->bqhd", pr, v).reshape(b, n, nh * d)
  return _linear(o, w, p + "attention.dense", cfg["use_bias"])


def mlp(x, w, p):
  """down(silu(gate(x)) * up(x)), no biases."""
  return (silu(x @ w[p + "gate_proj.weight"].T)
          * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def _top_idx(scores_TxK, k: int):
  """Indices of the k largest per row; ties go to the lower index."""
  return np.argsort(-scores_TxK, axis=-1, kind="stable")[:, :k]


def route(x_TxE, w, p, cfg):
  """(experts [T, k], weights [T, k]) of the sigmoid group-limited router."""
  e, g = cfg["num_experts"], cfg["n_group"]
  k, kg = cfg["num_experts_per_tok"], cfg["topk_group"]
  scores = 1.0 / (1.0 + np.exp(-(x_TxE @ w[p + "gate.weight"].T)))
  biased = scores + w[p + "gate.expert_bias"]
  grouped = biased.reshape(len(x_TxE), g, e // g)
  group_score = -np.sort(-grouped, axis=-1)[..., :2].sum(-1)
  keep = np.zeros((len(x_TxE), g), bool)
  np.put_along_axis(keep, _top_idx(group_score, kg), True, axis=-1)
  masked = np.where(np.repeat(keep, e // g, axis=-1), biased, -np.inf)
  idx = _top_idx(masked, k)
  weight = np.take_along_axis(scores, idx, axis=-1)
  if k > 1:
    weight = weight / (weight.sum(-1, keepdims=True) + 1e-20)
  return idx, weight * cfg["routed_scaling_factor"]


def moe(x_BxNxE, w, p, cfg):
  """Routed experts weighted by the router plus the shared experts."""
  shape = x_BxNxE.shape
  x = x_BxNxE.reshape(-1, shape[-1])
  idx, weight = route(x, w, p + "mlp.", cfg)
  y = np.zeros_like(x)
  for e in np.unique(idx):
    rows, slot = np.nonzero(idx == e)
    out = mlp(x[rows], w, f"{p}mlp.experts.{e}.")
    np.add.at(y, rows, out * weight[rows, slot, None])
  if cfg["num_shared_experts"]:  # 0 or None: nothing (a zero-width MLP)
    y = y + mlp(x, w, p + "mlp.shared_experts.")
  return y.reshape(shape)


def _bias(mask, block_length, b, n, dtype):
  """Additive attention bias [B, N, N] from a bool keep-mask, a float
  additive mask, or the block-causal rule (block_length)."""
  if mask is None:
    if block_length is None:
      return np.zeros((b, n, n), dtype)
    mask = block_causal_mask(n, block_length)
  mask = np.broadcast_to(np.asarray(mask), (b, n, n))
  if mask.dtype == bool:
    return np.where(mask, 0.0, -np.inf).astype(dtype)
  return mask.astype(dtype)


def forward(weights: dict, config: dict, ids_BxN, mask=None,
            block_length: int | None = None, positions_BxN=None,
            dtype=np.float64) -> np.ndarray:
  """logits [B, N, V] of LLaDA2MoeModelLM.

  weights: {HF tensor name: array}; config: the config.json dict; mask: bool
  [B, N, N] / [N, N] (True = may attend) or a float additive mask; without a
  mask, block_length applies the block-causal rule, and with neither the
  attention is fully bidirectional. positions default to arange(N), as the
  remote generate passes them.
  """
  cfg = resolve_config(config)
  w = {name: np.asarray(t, dtype) for name, t in weights.items()}
  ids = np.asarray(ids_BxN)
  b, n = ids.shape
  pos = (np.broadcast_to(np.arange(n), (b, n)) if positions_BxN is None
         else np.asarray(positions_BxN))
  cos, sin = rope_cos_sin(pos, rotary_dim(cfg), cfg["rope_theta"], dtype)
  bias = _bias(mask, block_length, b, n, dtype)
  eps = cfg["rms_norm_eps"]
  h = w["model.word_embeddings.weight"][ids]
  for layer in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{layer}."
    x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
    h = h + attention(x, w, p, cfg, bias, cos, sin)
    x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
    if cfg["num_experts"] is not None and layer >= cfg[
        "first_k_dense_replace"]:
      h = h + moe(x, w, p, cfg)
    else:
      h = h + mlp(x, w, p + "mlp.")
  h = rms_norm(h, w["model.norm.weight"], eps)
  head = w.get("lm_head.weight")
  if head is None or cfg["tie_word_embeddings"]:
    head = w["model.word_embeddings.weight"]
  return h @ head.T
