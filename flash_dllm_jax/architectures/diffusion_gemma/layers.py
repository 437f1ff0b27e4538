"""DiffusionGemma's parts in plain JAX over the official parameter tree
(the names gm.ckpts.load_params gives: `layer_N/attn/q_einsum/w`, ...),
restated from gemma/gm/nn/gemma4/{_layers,_modules,_moe}.py.

Shapes: B rows, Q queries, S cache slots, D model width, N query heads,
K kv heads, H key size, F MLP width, X experts, k chosen experts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma import sharding as sh
from flash_dllm_jax.architectures.diffusion_gemma.quant import (
    dequantize_experts, is_q, project)

_EPS = 1e-6
K_MASK = -2.3819763e38  # the official masked-logit value


def rms_norm(x, scale=None):
  """x / rms(x) (eps 1e-6, rsqrt as the official code), times `scale`
  (no 1 + scale: Gemma 4's norms store the factor itself)."""
  var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  out = x * jax.lax.rsqrt(var + _EPS)
  return out if scale is None else out * scale.astype(out.dtype)


def gelu_mlp(p, x_BxQxD, fmt=None, gating="gating_einsum", linear="linear"):
  """FeedForward: gelu(x W0) * (x W1) W2, with `gating` [2, F, D] and
  `linear` [F, D] stored bare (nn.share_scope), or in 8 bits (fmt)."""
  if is_q(p[gating]):
    f = p[gating]["kernel_q"].shape[0] // 2
    gate = project(x_BxQxD, p[gating], fmt, (2, f))
  else:
    gate = jnp.einsum("...F,NHF->...NH", x_BxQxD, p[gating])
  gate = sh.split(gate, gate.ndim - 1)
  act = sh.gather(jax.nn.gelu(gate[..., 0, :]) * gate[..., 1, :])
  if is_q(p[linear]):
    return sh.columns(lambda: project(act, p[linear], fmt,
                                      (p[linear]["kernel_q"].shape[0],)))
  return sh.columns(lambda: jnp.einsum("...H,HF->...F", act, p[linear]))


def rope(x_BxQxNxH, positions_BxQ, fraction: float, base: float,
         scale: float = 1.0):
  """Partial RoPE as Gemma 4's apply_rope: the first
  int(fraction * H // 2) frequencies (base ** (2i / H)) rotate pairs
  (i, i + H/2); the remaining pairs are left as they are."""
  h = x_BxQxNxH.shape[-1]
  rot = int(fraction * h // 2)
  exps = (2.0 / h) * jnp.arange(0, rot, dtype=jnp.float32)
  timescale = jnp.pad(base ** exps, (0, h // 2 - rot), mode="constant",
                      constant_values=(0, jnp.inf))
  angles = positions_BxQ[..., None] / timescale[None, None, :]
  angles = angles[..., None, :] / scale
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  first, second = jnp.split(x_BxQxNxH, 2, axis=-1)
  out = jnp.concatenate([first * cos - second * sin,
                         second * cos + first * sin], axis=-1)
  return out.astype(x_BxQxNxH.dtype)


def project_kv(p, config, kind, x_BxQxD, positions_BxQ):
  """(k, v) [B, Q, K, H] of new tokens: K=V layers take both from one
  projection, k then gets the key norm and RoPE, v the unscaled norm."""
  a = p["attn"]
  kv, h = config.kv_heads(kind), config.key_size(kind)
  if config.k_eq_v(kind):
    w = a["k_einsum"]["w"]
    k = v = (project(x_BxQxD, w, config.quantize, (kv, h)) if is_q(w) else
             jnp.einsum("BSD,KDH->BSKH", x_BxQxD, w))
  elif is_q(a["kv_einsum"]["w"]):
    y = project(x_BxQxD, a["kv_einsum"]["w"], config.quantize, (2, kv, h))
    k, v = y[..., 0, :, :], y[..., 1, :, :]
  else:
    k, v = jnp.einsum("BSD,CKDH->CBSKH", x_BxQxD, a["kv_einsum"]["w"])
  k, v = sh.split(k, 2), sh.split(v, 2)
  k = rms_norm(k, a["key_norm"]["scale"] if config.qk_norm_with_scale
               else None)
  v = rms_norm(v)
  fraction, base, scale = config.rope(kind)
  return rope(k, positions_BxQ, fraction, base, scale), v


def attend(p, config, kind, x_BxQxD, positions_BxQ, k_BxSxKxH, v_BxSxKxH,
           mask_BxQxS):
  """The attention output [B, Q, D] of queries x over keys/values with
  `mask` (no 1/sqrt(d): the query norm sets the scale)."""
  q = query(p, config, kind, x_BxQxD, positions_BxQ)
  b, t, n, h = q.shape
  kv = k_BxSxKxH.shape[2]
  q = q.reshape(b, t, kv, n // kv, h)
  logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k_BxSxKxH).reshape(
      b, t, n, -1)
  if config.attn_logits_softcap is not None:
    cap = config.attn_logits_softcap
    logits = jnp.tanh(logits / cap) * cap
  logits = jnp.where(mask_BxQxS[:, :, None, :], logits, K_MASK)
  probs = jax.nn.softmax(logits, axis=-1).astype(k_BxSxKxH.dtype)
  probs = probs.reshape(b, t, kv, n // kv, -1)
  enc = jnp.einsum("BTKGS,BSKH->BTKGH", probs, v_BxSxKxH).reshape(b, t, n, h)
  return attn_out(p, config, enc)


def query(p, config, kind, x_BxQxD, positions_BxQ):
  """q [B, Q, N, H]: projected, query-normed, RoPE'd (no 1/sqrt(d))."""
  a = p["attn"]
  w = a["q_einsum"]["w"]
  q = (project(x_BxQxD, w, config.quantize,
               (config.n_heads, config.key_size(kind))) if is_q(w) else
       jnp.einsum("BTD,NDH->BTNH", x_BxQxD, w))
  q = rms_norm(sh.split(q, 2), a["query_norm"]["scale"]
               if config.qk_norm_with_scale else None)
  fraction, base, scale = config.rope(kind)
  return rope(q, positions_BxQ, fraction, base, scale)


def attn_out(p, config, enc_BxQxNxH):
  """The attention output projection [B, Q, D] of the heads' values."""
  b, t, n, h = enc_BxQxNxH.shape
  w = p["attn"]["attn_vec_einsum"]["w"]
  enc = sh.gather(enc_BxQxNxH)  # every head, then this device's columns
  if is_q(w):
    return sh.columns(lambda: project(enc.reshape(b, t, n * h), w,
                                      config.quantize,
                                      (w["kernel_q"].shape[0],)))
  return sh.columns(lambda: jnp.einsum("BTNH,NHD->BTD", enc, w))


def moe(p, config, n_BxQxD, residual_BxQxD):
  """The MoE branch (_moe.MoERagged): router on the unnormalised residual
  (RMSNorm without scale, / sqrt(D), * router_scale), a float32 softmax
  over all experts, top-k, the chosen weights renormalised; each chosen
  expert's gelu MLP on the normalised input, times its per-expert scale,
  summed with the weights. Every expert runs on every row (chunks of
  experts), so a row's result depends on that row alone."""
  m = p["mlp"]
  d = n_BxQxD.shape[-1]
  ids_BxQxk, w_BxQxk = route(p, config, residual_BxQxD)
  gate = m["gating_einsum"]["w"]  # [X, 2, M, D]
  down = m["linear"]["w"]  # [X, M, D]
  scale = m["per_expert_scale"]
  x_TxD = n_BxQxD.reshape(-1, d)
  ids_Txk = ids_BxQxk.reshape(x_TxD.shape[0], -1)
  y_Txk = _experts(x_TxD, ids_Txk, gate, down, scale, config.moe_hidden)
  # float32 weights against the experts' outputs, rounded once (as the
  # official combine einsum promotes).
  out = jnp.einsum("tkd,tk->td", y_Txk, w_BxQxk.reshape(ids_Txk.shape),
                   preferred_element_type=y_Txk.dtype)
  return out.reshape(n_BxQxD.shape)


def route(p, config, residual_BxQxD):
  """(expert ids [B, Q, k], float32 weights [B, Q, k]): the router on the
  unnormalised residual (RMSNorm without scale, / sqrt(D), *
  router_scale), a float32 softmax over all experts, top-k, the chosen
  weights renormalised (_moe.MoERagged._router)."""
  m = p["mlp"]
  d = residual_BxQxD.shape[-1]
  r = rms_norm(residual_BxQxD)
  r = r * jax.lax.rsqrt(jnp.array(d, r.dtype)) * m["router_scale"].astype(
      r.dtype)
  logits = jnp.einsum("gsd,de->gse", r, m["router_logits"]["w"]).astype(
      jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  _, ids_BxQxk = jax.lax.top_k(logits, config.moe_top_k)
  chosen = jax.nn.one_hot(ids_BxQxk, probs.shape[-1], dtype=probs.dtype
                          ).sum(axis=-2)
  norm = jnp.sum(chosen * probs, axis=-1, keepdims=True)
  weights = probs / jnp.where(norm > 0.0, norm, 1.0)
  return ids_BxQxk, jnp.take_along_axis(weights, ids_BxQxk, axis=-1)


def _experts(x_TxD, ids_Txk, gate_XxTwoxMxD, down_XxMxD, scale_X, m: int,
             chunk_bytes=1 << 28):
  """y [T, k, D]: each (token, slot)'s expert on its row, times the
  expert's scale; experts run C at a time on every row (8-bit stacks
  dequantized a chunk at a time)."""
  t, d = x_TxD.shape
  x_n = scale_X.shape[0]
  c = max([n for n in range(1, x_n + 1) if x_n % n == 0
           and t * n * max(d, m) * 4 <= chunk_bytes] or [1])

  def run(gate, down, scale):
    if is_q(gate):  # [C, D, 2M] / [C, M, D] kernels back to the tree's
      gate = dequantize_experts(gate, x_TxD.dtype).reshape(
          -1, d, 2, m).transpose(0, 2, 3, 1)
      down = dequantize_experts(down, x_TxD.dtype)
    h = jnp.einsum("td,ckmd->ktcm", x_TxD, gate)
    act = jax.nn.gelu(h[0]) * h[1]
    return jnp.einsum("tcm,cmd->tcd", act, down) * scale.astype(
        x_TxD.dtype)[None, :, None]

  def pick(y_TxCxD, c0):
    return jnp.take_along_axis(
        y_TxCxD, jnp.clip(ids_Txk - c0, 0, c - 1)[..., None], axis=1)

  if c == x_n:
    return pick(run(gate_XxTwoxMxD, down_XxMxD, scale_X), 0)

  def step(y, args):
    c0, g, dn, s = args
    inside = (ids_Txk >= c0) & (ids_Txk < c0 + c)
    return jnp.where(inside[..., None], pick(run(g, dn, s), c0), y), None

  shape = lambda a: jax.tree.map(
      lambda v: v.reshape(x_n // c, c, *v.shape[1:]), a)
  y, _ = jax.lax.scan(step, jnp.zeros((t, ids_Txk.shape[1], d), x_TxD.dtype),
                      (jnp.arange(0, x_n, c), shape(gate_XxTwoxMxD),
                       shape(down_XxMxD), shape(scale_X)))
  return y
