"""DiffusionGemma's fast forward: model.forward's interface and math, with
routed experts and attention over the cache slots a row can see.

- MoE: the router of layers.route (float32 softmax over all experts on the
  scaled residual, top-k, renormalised), then only the chosen experts: on
  a GPU the engine's grouped GEMM (pallas_kernels/grouped_matmul, the one
  LLaDA2's and SDAR-MoE's experts run through: (token, slot) pairs sorted
  by expert into fixed tiles, K experts' FLOPs a token), gate and up in
  one product, gelu(gate) * up, then down, each rounded to the compute
  dtype as the official ragged products are; times the per-expert scale,
  combined with the float32 weights, plus the dense shared branch. 8-bit
  experts (quant.py's kernel_q [X, O, I] + scale) go through the same
  kernel. Elsewhere (implementation 'reference', the CPU's) every expert
  runs on every row (layers._experts), as ops.routed_experts does: XLA:CPU
  keeps a row's bits in those products whatever the rows beside it.
- Attention: local layers read a window of Q + W - 1 slots per row (the
  keys its queries' sliding windows can reach), global layers the whole
  cache under the s <= last_key mask (plain XLA: their key size and kv
  heads differ from the local layers', and their visible keys are a
  prefix of dynamic length); a pass of more than QUERY_CHUNK queries (a
  prefill) attends a chunk of queries at a time. Queries of a row hold
  consecutive slots (slot -1: padding), as every pass of the sampler.

Row invariance: every op is per row (per token for the experts), and the
grouped kernel's tiles never depend on the row count (its kernel.py), so
a row's logits do not depend on the rows beside it; tests check it bit for
bit (the decode's XLA options; on the CPU at the suite's level 0, and a
`gpu` test in bf16). Under a mesh's "model" axis the experts run where
they live and activations are gathered as sharding.py says (one device's
bits: tests/test_mesh_diffusion_gemma.py). A decode runs it batched on GPUs
and a row at a time elsewhere (FORWARDS). `implementation`: None (by backend), 'reference',
'pallas', 'pallas_interpret' or an ops.Kernels.

Shapes: B rows, Q queries, S slots, D width, X experts, k chosen, M an
expert's width, P padded (token, slot) rows, L window slots.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma import layers as L
from flash_dllm_jax.architectures.diffusion_gemma import model as ref
from flash_dllm_jax.architectures.diffusion_gemma import sharding as sh
from flash_dllm_jax.architectures.diffusion_gemma.config import (LOCAL,
                                                                  GemmaConfig)
from flash_dllm_jax.architectures.diffusion_gemma.quant import is_q
from flash_dllm_jax.ops.choice import expert_tiling, kernel_name
from pallas_kernels.grouped_matmul import api as grouped_api
from pallas_kernels.grouped_matmul import layout


def window(config: GemmaConfig, q_len: int, length: int) -> int:
  """L: the slots a local layer reads per row (Q + W - 1, at most S)."""
  return min(length, q_len + config.sliding_window - 1)


def _local_keys(config, k_BxSxKxH, v_BxSxKxH, slots_BxQ):
  """(k, v [B, L, K, H], their slots [B, L]): each row's window from
  max(first query slot - W + 1, 0), kept inside the cache."""
  s, q = k_BxSxKxH.shape[1], slots_BxQ.shape[1]
  n = window(config, q, s)
  first_B = jnp.min(jnp.where(slots_BxQ < 0, s, slots_BxQ), axis=1)
  start_B = jnp.clip(first_B - config.sliding_window + 1, 0, s - n)
  cut = lambda c, st: jax.lax.dynamic_slice_in_dim(c, st, n, axis=0)
  k = jax.vmap(cut)(k_BxSxKxH, start_B)
  v = jax.vmap(cut)(v_BxSxKxH, start_B)
  return k, v, start_B[:, None] + jnp.arange(n)[None, :]


def _softmax_attend(config, q_BxQxNxH, k_BxLxKxH, v_BxLxKxH, mask_BxQxL):
  """layers.attend's scores, mask, softmax and values [B, Q, N, H]."""
  b, t, n, h = q_BxQxNxH.shape
  kv = k_BxLxKxH.shape[2]
  q = q_BxQxNxH.reshape(b, t, kv, n // kv, h)
  logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k_BxLxKxH).reshape(b, t, n, -1)
  if config.attn_logits_softcap is not None:
    cap = config.attn_logits_softcap
    logits = jnp.tanh(logits / cap) * cap
  logits = jnp.where(mask_BxQxL[:, :, None, :], logits, L.K_MASK)
  probs = jax.nn.softmax(logits, axis=-1).astype(k_BxLxKxH.dtype)
  probs = probs.reshape(b, t, kv, n // kv, -1)
  return jnp.einsum("BTKGS,BSKH->BTKGH", probs, v_BxLxKxH).reshape(
      b, t, n, h)


# Queries attended at once: a longer pass (a prompt's prefill) runs its
# queries in chunks of this many, so its scores stay [B, 256, N, S] and a
# local layer's chunk reads 256 + W - 1 slots.
QUERY_CHUNK = 256


def _attend_chunk(config, kind, q_BxQxNxH, slots_BxQ, last_key_BxQ, k, v):
  """Values [B, Q, N, H] of queries over the slots they can see."""
  if kind == LOCAL:
    k, v, key_slots_BxL = _local_keys(config, k, v, slots_BxQ)
    s = key_slots_BxL[:, None, :]
    qs = slots_BxQ[:, :, None]
    w = config.sliding_window
    m = (s <= last_key_BxQ[:, :, None]) & (s > qs - w) & (s < qs + w)
  else:
    m = ref.mask(config, kind, slots_BxQ, last_key_BxQ, k.shape[1])
  return _softmax_attend(config, q_BxQxNxH, k, v, m)


def attend(p, config, kind, x_BxQxD, slots_BxQ, last_key_BxQ, cache):
  """The attention output [B, Q, D] over the slots the queries can see
  (the queries QUERY_CHUNK at a time: padded with slot -1 queries)."""
  q = L.query(p, config, kind, x_BxQxD, slots_BxQ)
  k, v = cache["k"], cache["v"]
  b, t, n, h = q.shape
  if t <= QUERY_CHUNK:
    enc = _attend_chunk(config, kind, q, slots_BxQ, last_key_BxQ, k, v)
    return L.attn_out(p, config, enc)
  chunks = -(-t // QUERY_CHUNK)
  pad = chunks * QUERY_CHUNK - t
  split = lambda a, fill: jnp.moveaxis(jnp.pad(
      a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2),
      constant_values=fill).reshape(b, chunks, QUERY_CHUNK, *a.shape[2:]),
      1, 0)
  enc = jax.lax.map(
      lambda c: _attend_chunk(config, kind, *c, k, v),
      (split(q, 0), split(slots_BxQ, -1), split(last_key_BxQ, -1)))
  enc = jnp.moveaxis(enc, 0, 1).reshape(b, chunks * QUERY_CHUNK, n, h)
  return L.attn_out(p, config, enc[:, :t])


def _stacks(m, x_dtype):
  """(gate+up, down) weight tuples for the grouped GEMM: gate [X, 2M, D]
  as (kernel_q-shaped [X, O, I], scale) (the official [X, 2, M, D]
  reshaped, scale ones: exact), down (kernel [X, M, D],), or quant.py's
  8-bit (kernel_q, scale) pairs as stored."""
  gate, down = m["gating_einsum"]["w"], m["linear"]["w"]
  if is_q(gate):
    return (gate["kernel_q"], gate["scale"]), (down["kernel_q"],
                                               down["scale"])
  x, two, mm, d = gate.shape
  ones = jnp.ones((x, two * mm, 1), jnp.float32)
  return (gate.reshape(x, two * mm, d), ones), (down,)


def routed_experts(m, config, x_TxD, ids_Txk, implementation=None):
  """y [T, k, D] in x's dtype: each (token, slot)'s expert MLP
  gelu(x Wg) * (x Wu) Wd times its per-expert scale, by the grouped GEMM
  (GPU) or every expert on every row (elsewhere)."""
  impl, tiling = kernel_name(implementation), expert_tiling(implementation)
  scale = m["per_expert_scale"].astype(x_TxD.dtype)
  if impl == "reference" or tiling is None:
    return L._experts(x_TxD, ids_Txk, m["gating_einsum"]["w"],
                      m["linear"]["w"], m["per_expert_scale"],
                      config.moe_hidden)
  (t, d), k = x_TxD.shape, ids_Txk.shape[1]
  gate, down = _stacks(m, x_TxD.dtype)
  n_experts, tile_m, mm = scale.shape[0], tiling.tile_m, config.moe_hidden
  dest_N, tiles = layout.sort_pairs(ids_Txk.reshape(-1), n_experts, tile_m)
  x_PxD = layout.gather_rows(x_TxD, dest_N, k, tiles.shape[0] * tile_m)
  run = lambda a, w: grouped_api.grouped_matmul(
      a, tiles, w, tile_m=tile_m, implementation=impl,
      **tiling.kernel_args())
  h_PxTwoM = run(x_PxD, gate)
  act = jax.nn.gelu(h_PxTwoM[:, :mm]) * h_PxTwoM[:, mm:]
  y_NxD = layout.scatter_back(run(act, down), dest_N, fill=0.0)
  return y_NxD.reshape(t, k, d) * scale[ids_Txk][..., None]


def moe(p, config, n_BxQxD, residual_BxQxD, implementation=None):
  """layers.moe with routed experts: [B, Q, D]."""
  d = n_BxQxD.shape[-1]
  ids_BxQxk, w_BxQxk = L.route(p, config, residual_BxQxD)
  x_TxD = n_BxQxD.reshape(-1, d)
  ids_Txk = ids_BxQxk.reshape(x_TxD.shape[0], -1)
  stacks = {k: p["mlp"][k] for k in ("gating_einsum", "linear",
                                      "per_expert_scale")}
  y_Txk = sh.experts(
      lambda m, x, ids: routed_experts(m, config, x, ids, implementation),
      stacks, x_TxD, ids_Txk, config.moe_experts)
  out = jnp.einsum("tkd,tk->td", y_Txk, w_BxQxk.reshape(ids_Txk.shape),
                   preferred_element_type=y_Txk.dtype)
  return out.reshape(n_BxQxD.shape)


def _ffw(p, config, h_BxQxD, implementation):
  if not config.moe_experts:
    return ref._ffw(p, config, h_BxQxD)
  post = lambda name, x: (L.rms_norm(x, p[name]["scale"])
                          if config.use_post_ffw_norm else x)
  dense = post("post_ffw2_norm", L.gelu_mlp(
      p["mlp2"], L.rms_norm(h_BxQxD, p["pre_ffw2_norm"]["scale"]),
      config.quantize))
  routed = post("post_ffw1_norm", moe(
      p, config, L.rms_norm(h_BxQxD, p["pre_ffw_norm"]["scale"]), h_BxQxD,
      implementation))
  return post("post_ffw_norm", dense + routed)


def block(p, config, kind, x_BxQxD, slots_BxQ, last_key_BxQ, layer_cache,
          implementation=None):
  """model.block with the fast attention and experts."""
  n = L.rms_norm(x_BxQxD, p["pre_attention_norm"]["scale"])
  k, v = L.project_kv(p, config, kind, n, slots_BxQ)
  cache = {"k": sh.split(ref._write(layer_cache["k"], k, slots_BxQ), 2),
           "v": sh.split(ref._write(layer_cache["v"], v, slots_BxQ), 2)}
  a = attend(p, config, kind, n, slots_BxQ, last_key_BxQ, cache)
  if config.use_post_attn_norm:
    a = L.rms_norm(a, p["post_attention_norm"]["scale"])
  h = a + x_BxQxD
  out = _ffw(p, config, h, implementation) + h
  return sh.gather(out * p["skip_scale"].astype(out.dtype)), cache


def forward(params, config: GemmaConfig, tokens_BxQ, slots_BxQ, cache,
            last_key_BxQ, sc_BxQxD=None, logits: bool = True,
            implementation=None):
  """model.forward's contract (logits [B, Q, V] float32 or None, the
  cache with the queries' K/V written), computed by the fast parts."""
  if len(cache) != config.n_layers:
    raise ValueError(f"the cache has {len(cache)} layers, the model "
                     f"{config.n_layers}")
  x = ref.embed(params, config, tokens_BxQ)
  if sc_BxQxD is not None:
    x = ref.self_condition(params, x, sc_BxQxD, config.quantize)
  new_cache = []
  for i, kind in enumerate(config.layer_kinds):
    x, c = block(params[f"layer_{i}"], config, kind, x, slots_BxQ,
                 last_key_BxQ, cache[i], implementation)
    new_cache.append(c)
  if not logits:
    return None, tuple(new_cache)
  return ref.head(params, config, x), tuple(new_cache)


def _sampler_fast(model, *args, **kwargs):
  """`forward` in a decode: batched on GPUs (row-invariant there by its
  kernels and the decode's XLA options), one row at a time elsewhere
  (XLA:CPU at its default optimisation level gave a batch of one other
  last bits than a batch of two)."""
  run = functools.partial(forward,
                          implementation=model.implementation)
  if jax.default_backend() in ("gpu", "cuda"):
    return run(*args, **kwargs)
  return ref.forward_rows(*args, **kwargs, fn=run)


# The forwards a decode can run (the `forward` option): the fast one, and
# the plain reference one row at a time, kept for checking.
FORWARDS = {"fast": _sampler_fast,
            "rows": lambda model, *a, **k: ref.forward_rows(*a, **k)}
