"""The attention part of a block: q/k/v projections (optionally joined, with
biases), QK-norm, (partial) RoPE, then attention uncached or over a KV
cache. Its parameters belong to the calling Block (`layers_N/q_proj`, ...),
so every architecture's checkpoints keep one flat layout per layer.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import fuse
from flash_dllm_jax.model.layers import RMSNorm, apply_rope


@struct.dataclass
class CachedExtras:
  """Options of a cached forward beyond "write my K/V, attend to the cache".

  write_cache: False runs the queries without writing their K/V (a verify
    pass); they then see each other only where inq_mask_BxQxQ allows.
  exclude_BxS: cache slots hidden from every query (e.g. the slots the
    queries themselves re-encode).
  mass_rows_BxQ: query rows whose attention probabilities, summed over heads,
    are accumulated per key into the "attention_mass" intermediate.
  mass_prefix: mass rows lie among the first mass_prefix queries (later ones
    are ignored), so the kernel can score those rows alone.
  mass_score: "mass" accumulates softmax probabilities, "logit" the scaled
    pre-softmax q.k (summed the same way).
  side_rows: the last side_rows queries form a second group (a verify pass
    riding on a cache-writing one, so both share one weight read): they
    write nothing, attend to the cache after the first group's write minus
    side_exclude_BxS, and see each other where side_inq_BxVxV allows; the
    first group never sees them, and the options above apply to it alone.
  """

  write_cache: bool = struct.field(pytree_node=False, default=True)
  exclude_BxS: jax.Array | None = None
  inq_mask_BxQxQ: jax.Array | None = None
  mass_rows_BxQ: jax.Array | None = None
  mass_prefix: int | None = struct.field(pytree_node=False, default=None)
  mass_score: str = struct.field(pytree_node=False, default="mass")
  side_rows: int = struct.field(pytree_node=False, default=0)
  side_exclude_BxS: jax.Array | None = None
  side_inq_BxVxV: jax.Array | None = None


def project_qkv(block: nn.Module, cfg: ModelConfig, n_BxQxE: jax.Array,
                dense) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD) before RoPE, QK-normed where the
  architecture norms them; `dense(name, features, bias)` makes a Linear."""
  b, q, _ = n_BxQxE.shape
  h, k, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  if cfg.fused_qkv:
    q_BxQxHxD, k_BxQxKxD, v_BxQxKxD = fuse.split_qkv(dense(
        "qkv_proj", fuse.qkv_features(cfg), cfg.qkv_bias)(n_BxQxE), cfg)
  else:
    q_BxQxHxD = dense("q_proj", h * d, cfg.qkv_bias)(n_BxQxE).reshape(
        b, q, h, d)
    k_BxQxKxD = dense("k_proj", k * d, cfg.qkv_bias)(n_BxQxE).reshape(
        b, q, k, d)
    v_BxQxKxD = dense("v_proj", k * d, cfg.qkv_bias)(n_BxQxE).reshape(
        b, q, k, d)
  if cfg.spec.attention.qk_norm:
    norm = lambda name, x: RMSNorm(cfg.rms_norm_eps, block.param_dtype,
                                   block.implementation, name=name)(x)
    q_BxQxHxD = norm("q_norm", q_BxQxHxD)
    k_BxQxKxD = norm("k_norm", k_BxQxKxD)
  return q_BxQxHxD, k_BxQxKxD, v_BxQxKxD


def attend(block: nn.Module, cfg: ModelConfig, n_BxQxE, positions_BxQ,
           cos_BxQxR, sin_BxQxR, key_valid, dense, cache_kv=None,
           slots_BxQ=None, extras: CachedExtras | None = None):
  """The attention output o_BxQxHD (before attn_out) and the layer's new
  (k, v) cache (None uncached). key_valid: [B, S], or an ops.BlockCausal
  mask per query (cached: the exact block-causal path; extras unused)."""
  b, q, _ = n_BxQxE.shape
  q_BxQxHxD, k_BxQxKxD, v_BxQxKxD = project_qkv(block, cfg, n_BxQxE, dense)
  if cache_kv is not None and extras is not None and extras.side_rows:
    return _with_side_rows(block, cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD,
                           positions_BxQ, cos_BxQxR, sin_BxQxR, key_valid,
                           cache_kv, slots_BxQ, extras)
  return _attend_projected(block, cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD,
                           positions_BxQ, cos_BxQxR, sin_BxQxR, key_valid,
                           cache_kv, slots_BxQ, extras)


def _with_side_rows(block, cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD,
                    positions_BxQ, cos_BxQxR, sin_BxQxR, key_valid, cache_kv,
                    slots_BxQ, extras):
  """CachedExtras.side_rows: the first group as a plain cached pass, then
  the side group as a no-write pass over the cache that pass wrote."""
  v = extras.side_rows
  main = lambda x: x[:, :-v]
  side = lambda x: x[:, -v:]
  first = extras.replace(side_rows=0, side_exclude_BxS=None,
                         side_inq_BxVxV=None)
  o_main, new_kv = _attend_projected(
      block, cfg, *map(main, (q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ,
                              cos_BxQxR, sin_BxQxR)),
      key_valid, cache_kv, main(slots_BxQ), first)
  o_side, _ = _attend_projected(
      block, cfg, *map(side, (q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ,
                              cos_BxQxR, sin_BxQxR)),
      key_valid, new_kv, side(slots_BxQ), CachedExtras(
          write_cache=False, exclude_BxS=extras.side_exclude_BxS,
          inq_mask_BxQxQ=extras.side_inq_BxVxV), sow_mass=False)
  return jnp.concatenate([o_main, o_side], axis=1), new_kv


def _attend_projected(block, cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD,
                      positions_BxQ, cos_BxQxR, sin_BxQxR, key_valid,
                      cache_kv, slots_BxQ, extras, sow_mass: bool = True):
  """`attend` after the projections."""
  b, q = q_BxQxHxD.shape[:2]
  d = cfg.head_dim
  rope = lambda x, _: apply_rope(x, cos_BxQxR, sin_BxQxR, cfg.rope_in_float32)
  scale = 1.0 / math.sqrt(d)
  impl = block.implementation
  new_kv = None
  if cache_kv is None:
    o_BxQxHxD = ops.attention(rope(q_BxQxHxD, None), rope(k_BxQxKxD, None),
                              v_BxQxKxD, key_valid, scale=scale,
                              implementation=impl)
    return o_BxQxHxD.reshape(b, q, -1), None
  if isinstance(key_valid, ops.BlockCausal):  # exact block-causal path
    if len(cache_kv) == 4:
      raise ValueError("block-causal cached attention takes no 8-bit KV "
                       "cache (kv_cache_dtype 'auto' only)")
    return _exact_cached(cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, rope,
                         key_valid, cache_kv, slots_BxQ, scale, impl)
  extras = extras or CachedExtras()
  scales = {}
  if len(cache_kv) == 4 and extras.write_cache:  # an 8-bit cache
    q_BxQxHxD, new_kv = ops.rope_and_write_8bit(
        q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ, cache_kv,
        scale=scale, rope_fn=rope)
    keys_BxSxKxD, values_BxSxKxD = new_kv[:2]
    scales = dict(k_scale_BxSxK=new_kv[2], v_scale_BxSxK=new_kv[3])
    k_new_BxQxKxD = v_new_BxQxKxD = None
  elif extras.write_cache:
    q_BxQxHxD, keys_BxSxKxD, values_BxSxKxD = ops.rope_and_write(
        q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
        cache_kv[0], cache_kv[1], theta=cfg.rope_theta, scale=scale,
        rope_fn=rope, rope_dim=cfg.rope_dim, implementation=impl)
    new_kv = (keys_BxSxKxD, values_BxSxKxD)
    k_new_BxQxKxD = v_new_BxQxKxD = None
  else:  # the queries see each other only through extras.inq_mask
    q_BxQxHxD = (rope(q_BxQxHxD, None).astype(jnp.float32) * scale
                 ).astype(q_BxQxHxD.dtype)
    keys_BxSxKxD, values_BxSxKxD = cache_kv[:2]
    if len(cache_kv) == 4:
      scales = dict(k_scale_BxSxK=cache_kv[2], v_scale_BxSxK=cache_kv[3])
    k_new_BxQxKxD, v_new_BxQxKxD = rope(k_BxQxKxD, None), v_BxQxKxD
    new_kv = cache_kv
  o_BxQxHxD, mass_BxS = ops.cached_attention(
      q_BxQxHxD, keys_BxSxKxD, values_BxSxKxD, key_valid,
      exclude_BxS=extras.exclude_BxS, k_new_BxQxKxD=k_new_BxQxKxD,
      v_new_BxQxKxD=v_new_BxQxKxD, inq_mask_BxQxQ=extras.inq_mask_BxQxQ,
      mass_rows_BxQ=extras.mass_rows_BxQ if block.sow_mass and sow_mass
      else None,
      mass_prefix=extras.mass_prefix, mass_score=extras.mass_score,
      implementation=impl, **scales)
  if mass_BxS is not None:
    block.sow("intermediates", "attention_mass", mass_BxS)
  return o_BxQxHxD.reshape(b, q, -1), new_kv


def _exact_cached(cfg, q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, rope,
                  key_valid, cache_kv, slots_BxQ, scale, impl):
  """Writes the queries' K/V at their slots, then attends over the cache
  with the uncached forward's own attention (`ops.attention`, same
  scaling; under Kernels(block_attention="split"), block by block with
  splits counted from each block's end, ops/block_attention.py): a
  query's scores, softmax and key sums are the uncached ones whenever the cache holds the keys that
  forward would compute, which block-causal attention guarantees for
  finished blocks."""
  b, q = q_BxQxHxD.shape[:2]
  keys_BxSxKxD = ops.write_cache(cache_kv[0], rope(k_BxQxKxD, None),
                                 slots_BxQ)
  values_BxSxKxD = ops.write_cache(cache_kv[1], v_BxQxKxD, slots_BxQ)
  o_BxQxHxD = ops.attention(rope(q_BxQxHxD, None), keys_BxSxKxD,
                            values_BxSxKxD, key_valid, scale=scale,
                            implementation=impl)
  return o_BxQxHxD.reshape(b, q, -1), (keys_BxSxKxD, values_BxSxKxD)

