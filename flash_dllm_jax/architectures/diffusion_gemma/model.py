"""DiffusionGemma's forward in plain JAX over the official parameter tree:
the calls the official sampler makes (gemma/diffusion/_sampler.py),
restated from gemma/gm/nn/gemma4/_transformer.py and
gemma/diffusion/_transformer.py.

The KV cache is addressed by slot: a query's slot is both where its K/V
are written and its RoPE position (the official cache of one row keeps
slot == position), and each query attends to the slots s with
s <= last_key[b, q] (causal prefill and append: its own slot; a canvas
being denoised: its last slot), local layers also to
slot_q - W < s < slot_q + W only (the official block-local mask and the
positional sliding mask it is ANDed with). Slot -1 is a padding query:
nothing written, its output meaningless. No reduction crosses rows.

Shapes: B rows, Q queries, S slots, D width, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma.config import (GLOBAL,
                                                                  LOCAL,
                                                                  GemmaConfig)
from flash_dllm_jax.architectures.diffusion_gemma.layers import (attend,
                                                                  gelu_mlp,
                                                                  moe,
                                                                  project_kv,
                                                                  rms_norm)

Params = dict[str, Any]
Cache = tuple[dict[str, jax.Array], ...]  # per layer {"k", "v"} [B,S,K,H]


def empty_cache(config: GemmaConfig, batch: int, length: int,
                dtype=None) -> Cache:
  """Zeros for `length` slots of every layer (its own kv heads and key
  size: global layers may differ from local ones)."""
  dtype = jnp.dtype(dtype or config.dtype)
  out = []
  for kind in config.layer_kinds:
    shape = (batch, length, config.kv_heads(kind), config.key_size(kind))
    out.append({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)})
  return tuple(out)


def embed(params: Params, config: GemmaConfig, tokens_BxQ) -> jax.Array:
  """table[token] * sqrt(D) (Embedder.encode)."""
  table = params["embedder"]["input_embedding"]
  x = table[(tokens_BxQ,)]
  return x * jnp.sqrt(config.d_model).astype(x.dtype)


def self_condition(params: Params, emb_BxQxD, sc_BxQxD, fmt=None
                   ) -> jax.Array:
  """post_norm(emb + FFW(pre_norm(sc))) (SelfConditioning; post_norm has
  no scale). An all-zero sc gives post_norm(emb)."""
  p = params["self_conditioner"]
  sc = sc_BxQxD.astype(emb_BxQxD.dtype)
  signal = gelu_mlp(p["ffw"], rms_norm(sc, p["pre_norm"]["scale"]), fmt)
  return rms_norm(emb_BxQxD + signal)


def encode_logits(params: Params, config: GemmaConfig, logits_BxQxV
                  ) -> jax.Array:
  """The next step's self-conditioning signal (Embedder.encode_logits):
  softmax(logits in float32), back in the logits' dtype, times the table,
  times sqrt(D)."""
  probs = jax.nn.softmax(logits_BxQxV.astype(jnp.float32), axis=-1).astype(
      logits_BxQxV.dtype)
  x = jnp.einsum("...v,ve->...e", probs,
                 params["embedder"]["input_embedding"])
  return x * jnp.sqrt(config.d_model).astype(x.dtype)


def mask(config: GemmaConfig, kind: str, slots_BxQ, last_key_BxQ,
         length: int) -> jax.Array:
  """[B, Q, S]: s <= last_key, and for local layers |slot_q - s| < W."""
  s = jnp.arange(length)[None, None, :]
  m = s <= last_key_BxQ[:, :, None]
  if kind == LOCAL:
    q = slots_BxQ[:, :, None]
    w = config.sliding_window
    m &= (s > q - w) & (s < q + w)
  return m


def _write(cache_BxSxKxH, new_BxQxKxH, slots_BxQ):
  length = cache_BxSxKxH.shape[1]
  slots = jnp.where(slots_BxQ < 0, length, slots_BxQ)  # dropped
  rows = jnp.arange(slots.shape[0])[:, None]
  return cache_BxSxKxH.at[rows, slots].set(
      new_BxQxKxH.astype(cache_BxSxKxH.dtype), mode="drop")


def _ffw(p, config: GemmaConfig, h_BxQxD):
  post = lambda name, x: (rms_norm(x, p[name]["scale"])
                          if config.use_post_ffw_norm else x)
  if not config.moe_experts:
    return post("post_ffw_norm", gelu_mlp(
        p["mlp"], rms_norm(h_BxQxD, p["pre_ffw_norm"]["scale"]),
        config.quantize))
  dense = post("post_ffw2_norm", gelu_mlp(
      p["mlp2"], rms_norm(h_BxQxD, p["pre_ffw2_norm"]["scale"]),
      config.quantize))
  routed = post("post_ffw1_norm", moe(
      p, config, rms_norm(h_BxQxD, p["pre_ffw_norm"]["scale"]), h_BxQxD))
  return post("post_ffw_norm", dense + routed)


def block(p, config: GemmaConfig, kind: str, x_BxQxD, slots_BxQ,
          last_key_BxQ, layer_cache):
  """One layer (_modules.Block): writes the queries' K/V at their slots,
  then attention, norms, residuals, the FFW and the skip scale."""
  n = rms_norm(x_BxQxD, p["pre_attention_norm"]["scale"])
  k, v = project_kv(p, config, kind, n, slots_BxQ)
  cache = {"k": _write(layer_cache["k"], k, slots_BxQ),
           "v": _write(layer_cache["v"], v, slots_BxQ)}
  m = mask(config, kind, slots_BxQ, last_key_BxQ, cache["k"].shape[1])
  a = attend(p, config, kind, n, slots_BxQ, cache["k"], cache["v"], m)
  if config.use_post_attn_norm:
    a = rms_norm(a, p["post_attention_norm"]["scale"])
  h = a + x_BxQxD
  out = _ffw(p, config, h) + h
  return out * p["skip_scale"].astype(out.dtype), cache


def forward(params: Params, config: GemmaConfig, tokens_BxQ, slots_BxQ,
            cache: Cache, last_key_BxQ, sc_BxQxD=None, logits: bool = True
            ) -> tuple[jax.Array | None, Cache]:
  """(logits [B, Q, V] float32 after the final softcap, or None; the
  cache with the queries' K/V written). sc None: plain embeddings
  (prefill, append); an array: the self-conditioning block on them (a
  canvas being denoised)."""
  if len(cache) != config.n_layers:
    raise ValueError(f"the cache has {len(cache)} layers, the model "
                     f"{config.n_layers}")
  x = embed(params, config, tokens_BxQ)
  if sc_BxQxD is not None:
    x = self_condition(params, x, sc_BxQxD, config.quantize)
  new_cache = []
  for i, kind in enumerate(config.layer_kinds):
    x, c = block(params[f"layer_{i}"], config, kind, x, slots_BxQ,
                 last_key_BxQ, cache[i])
    new_cache.append(c)
  if not logits:
    return None, tuple(new_cache)
  return head(params, config, x), tuple(new_cache)


def forward_rows(params: Params, config: GemmaConfig, tokens_BxQ, slots_BxQ,
                 cache: Cache, last_key_BxQ, sc_BxQxD=None,
                 logits: bool = True, fn=None
                 ) -> tuple[jax.Array | None, Cache]:
  """`forward` (or `fn`, of the same contract) one row at a time
  (lax.map): every row runs the program of a batch of one, so its bits
  never depend on the rows beside it (XLA:CPU at its default optimisation
  level gave a row alone other last bits than the same row in a batch of
  two, in the plain and the fast forward alike)."""
  fn = fn or forward

  def one(args):
    tokens, slots, cache_row, last, sc = args
    lift = lambda a: None if a is None else a[None]
    out, new = fn(params, config, tokens[None], slots[None],
                  jax.tree.map(lift, cache_row), last[None], lift(sc),
                  logits)
    return (None if out is None else out[0]), jax.tree.map(
        lambda a: a[0], new)
  return jax.lax.map(one, (tokens_BxQ, slots_BxQ, cache, last_key_BxQ,
                           sc_BxQxD))


def head(params: Params, config: GemmaConfig, x_BxQxD) -> jax.Array:
  """final_norm, the tied table's logits, the final softcap; float32."""
  x = rms_norm(x_BxQxD, params["final_norm"]["scale"])
  out = jnp.dot(x, params["embedder"]["input_embedding"].T)
  cap = config.final_logit_softcap
  if cap is not None:
    out = jnp.tanh(out / cap) * cap
  return out.astype(jnp.float32)


def causal(slots_BxQ):
  """last_key of a causal pass (prefill, append): each query's own slot."""
  return slots_BxQ


def canvas(slots_BxQ):
  """last_key of a canvas being denoised: the canvas's last slot."""
  return jnp.broadcast_to(jnp.max(slots_BxQ, axis=1, keepdims=True),
                          slots_BxQ.shape)


__all__ = ["GLOBAL", "LOCAL", "causal", "canvas", "embed", "empty_cache",
           "encode_logits", "forward", "forward_rows", "head", "mask"]
