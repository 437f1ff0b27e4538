"""Attention: uncached (cuDNN / XLA), the cache write with RoPE, and the
scheduled attention over a KV cache with its attention mass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel
from flash_dllm_jax.ops.block_attention import (BlockCausal,
                                               blockwise_attention)
from flash_dllm_jax.ops.choice import (backend_name, kernel_name,
                                      tiling as tiling_of)
from flash_dllm_jax.ops.choice import block_attention as block_attention_of
from pallas_kernels.attention import api as attention_api
from pallas_kernels.attention import kv_quant
from pallas_kernels.cache_update import api as cache_api
from pallas_kernels.cache_update import reference as cache_reference


# Queries a block-causal attention runs at once: a longer pass (a long
# prompt's prefill) attends QUERY_CHUNK queries at a time with the mask of
# those queries alone, so no [B, Q, S] mask (nor cuDNN's [B, 1, Q, S] bias
# of it) exists. A fixed count, never the batch's: a row's bits stay
# batch-invariant.
QUERY_CHUNK = 1024


def attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
              v_BxSxKxD: jax.Array, key_valid, *, scale: float,
              implementation: str | None = None,
              query_chunk: int | None = None) -> jax.Array:
  """Bidirectional GQA attention of all queries over all keys (uncached
  forwards and training, Q = S). key_valid: [B, S], [B, Q, S] for a mask
  per query, or a BlockCausal (block-causal families), which runs
  query_chunk (default QUERY_CHUNK) queries at a time past that many: each
  query row's scores, softmax and sums are over the same S keys either way.

  On a GPU (implementation resolving to 'pallas') this is JAX's fused
  attention, cuDNN's flash attention where it applies: the reference
  materialises B x H x Q x S float32 scores, about half of a training step's
  HBM traffic for the shipped model. Under a mesh it runs per shard (rows on
  'data', heads on 'model'), the same computation as on one device, so the
  mesh does not change which attention a row gets. Elsewhere, and for
  'pallas_interpret', the plain-JAX reference.

  A BlockCausal with block_length, under Kernels(block_attention="split")
  on the kernel ('pallas' or 'pallas_interpret'), runs
  `blockwise_attention` instead (opt-in): the split kernel, decode block
  by decode block.
  """
  if (isinstance(key_valid, BlockCausal) and key_valid.block_length
      and block_attention_of(implementation) == "split"
      and kernel_name(implementation) in ("pallas", "pallas_interpret")):
    return blockwise_attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid,
                               scale=scale, implementation=implementation)
  if not isinstance(key_valid, BlockCausal):
    return _attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid, scale,
                      implementation)
  b, q = q_BxQxHxD.shape[:2]
  c = query_chunk or QUERY_CHUNK
  if q <= c:
    return _attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid.mask(),
                      scale, implementation)
  n = -(-q // c)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, n * c - q)]
                          + [(0, 0)] * (x.ndim - 2))
  chunks = lambda x: jnp.moveaxis(pad(x).reshape(b, n, c, *x.shape[2:]), 1, 0)
  o_NxBxCxHxD = jax.lax.map(
      lambda qb: _attention(qb[0], k_BxSxKxD, v_BxSxKxD, key_valid.mask(qb[1]),
                            scale, implementation),
      (chunks(q_BxQxHxD), chunks(key_valid.blocks_BxQ)))
  o_BxQxHxD = jnp.moveaxis(o_NxBxCxHxD, 0, 1).reshape(
      b, n * c, *q_BxQxHxD.shape[2:])
  return o_BxQxHxD[:, :q]


def _attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid, scale,
               implementation):
  """`attention` over a materialised mask ([B, S] or [B, Q, S])."""
  if kernel_name(implementation) != "pallas":
    return attention_api.masked_attention(
        q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid, scale=scale,
        implementation="reference")
  attend = lambda q, k, v, valid: attention_api.masked_attention(
      q, k, v, valid, scale=scale, implementation="fused")
  mesh = parallel.active_mesh()
  if mesh is not None:
    heads = parallel.HEADS_SPEC
    attend = parallel.shard_map(attend, mesh,
                                (heads, heads, heads, P("data")), heads)
  return attend(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid)


def write_cache(cache_BxSxKxD: jax.Array, new_BxQxKxD: jax.Array,
                slots_BxQ: jax.Array) -> jax.Array:
  """Writes fresh K or V rows at their cache slots (-1 = skip)."""
  return parallel.constrain(
      cache_reference.write_rows(cache_BxSxKxD, new_BxQxKxD, slots_BxQ),
      parallel.CACHE_SPEC)


def rope_and_write(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
                   k_cache_BxSxKxD, v_cache_BxSxKxD, *, theta: float,
                   scale: float, rope_fn, rope_dim: int | None = None,
                   implementation: str | None = None):
  """RoPE q and k, scale q, write k and v into the caches at `slots_BxQ`.
  rope_dim: the leading dims RoPE rotates (None: all); partial RoPE takes
  the reference path (the kernel rotates whole heads).

  Returns (q_BxQxHxD rotated and scaled, k_cache, v_cache). The kernel fuses
  all of it and writes in place (donate the caches); it rotates in float32.
  The reference path applies the model's own `rope_fn(x, positions)`, which
  keeps Dream's bf16 rotation bit-faithful.
  """
  impl = backend_name(implementation, "cache_update")
  if rope_dim is not None and rope_dim != q_BxQxHxD.shape[-1]:
    impl = "reference"
  if impl != "reference":
    kernel = lambda *args: cache_api.rope_write(
        *args, theta=theta, scale=scale, implementation=impl)
    mesh = parallel.active_mesh()
    if mesh is not None:
      heads, rows = parallel.HEADS_SPEC, P("data")
      kernel = parallel.shard_map(kernel, mesh,
                                  (heads, heads, heads, rows, rows, heads,
                                   heads), (heads, heads, heads))
    return kernel(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
                  k_cache_BxSxKxD, v_cache_BxSxKxD)
  q = rope_fn(q_BxQxHxD, positions_BxQ)
  q = (q.astype(jnp.float32) * scale).astype(q_BxQxHxD.dtype)
  k = rope_fn(k_BxQxKxD, positions_BxQ)
  return (q, write_cache(k_cache_BxSxKxD, k, slots_BxQ),
          write_cache(v_cache_BxSxKxD, v_BxQxKxD, slots_BxQ))


SCALE_SPEC = P("data", None, "model")  # an 8-bit cache's scales [B, S, K]


def rope_and_write_8bit(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ,
                        slots_BxQ, caches, *, scale: float, rope_fn):
  """`rope_and_write` into an 8-bit cache: caches = (k, v, k_scale,
  v_scale) (model/cache.py); K (after RoPE) and V are quantized per slot
  and KV head (kv_quant.quantize) and written with their scales.
  Returns (q_BxQxHxD rotated and scaled, the four caches)."""
  k_cache, v_cache, ks_cache, vs_cache = caches
  q = rope_fn(q_BxQxHxD, positions_BxQ)
  q = (q.astype(jnp.float32) * scale).astype(q_BxQxHxD.dtype)
  kq, ks = kv_quant.quantize(rope_fn(k_BxQxKxD, positions_BxQ), k_cache.dtype)
  vq, vs = kv_quant.quantize(v_BxQxKxD, v_cache.dtype)
  put_scale = lambda c, x: parallel.constrain(
      cache_reference.write_rows(c, x, slots_BxQ), SCALE_SPEC)
  return q, (write_cache(k_cache, kq, slots_BxQ),
             write_cache(v_cache, vq, slots_BxQ),
             put_scale(ks_cache, ks), put_scale(vs_cache, vs))


def cached_attention(q_BxQxHxD: jax.Array, k_cache_BxSxKxD: jax.Array,
                     v_cache_BxSxKxD: jax.Array, key_valid_BxS: jax.Array, *,
                     exclude_BxS: jax.Array | None = None,
                     k_new_BxQxKxD: jax.Array | None = None,
                     v_new_BxQxKxD: jax.Array | None = None,
                     inq_mask_BxQxQ: jax.Array | None = None,
                     mass_rows_BxQ: jax.Array | None = None,
                     mass_prefix: int | None = None,
                     mass_score: str = "mass",
                     implementation: str | None = None,
                     k_scale_BxSxK: jax.Array | None = None,
                     v_scale_BxSxK: jax.Array | None = None):
  """Pre-scaled queries over the valid, non-excluded cache slots, plus their
  own fresh keys where inq_mask_BxQxQ allows, in one softmax. k_scale_BxSxK,
  v_scale_BxSxK: an 8-bit cache's scales (read and dequantized in the
  kernel).

  Returns (o_BxQxHxD, mass_BxS or None): mass sums, over heads and the rows
  in mass_rows_BxQ, the probability each cache slot receives. The kernel reads
  the cache in place and accumulates the mass without materialising scores;
  the reference materialises them. mass_prefix: mass rows are among the
  first mass_prefix queries (later ones are ignored), which lets the kernel
  score those rows alone. mass_score "logit" sums the pre-softmax scaled q.k
  per slot instead of probabilities (Flash-dLLM's ranking of decoded tokens).

  Under a mesh the kernel runs per shard (rows on "data", heads on "model")
  with the key splits one device would pick, and the mass of every KV head
  is gathered over "model" before one fixed-order sum over heads: the same
  bits on every mesh. The splits one program runs (the tiling's
  group_target rule) follow the shard's own rows and heads, the programs
  one device runs: a choice that changes no bit.
  """
  impl = backend_name(implementation, "attention_backend")
  b, q = q_BxQxHxD.shape[:2]
  s = k_cache_BxSxKxD.shape[1]
  exclude = ~key_valid_BxS
  if exclude_BxS is not None:
    exclude = exclude | exclude_BxS
  heads, rows = parallel.HEADS_SPEC, P("data")
  named = dict(q_BxQxHxD=(q_BxQxHxD, heads),
               k_cache_BxSxKxD=(k_cache_BxSxKxD, heads),
               v_cache_BxSxKxD=(v_cache_BxSxKxD, heads),
               k_len_B=(jnp.full((b,), s, jnp.int32), rows),
               q_len_B=(jnp.full((b,), q, jnp.int32), rows),
               k_new_BxIxKxD=(k_new_BxQxKxD, heads),
               v_new_BxIxKxD=(v_new_BxQxKxD, heads),
               inq_mask_BxQxI=(inq_mask_BxQxQ, rows),
               exclude_BxS=(exclude, rows),
               score_rows_BxQ=(mass_rows_BxQ, rows),
               k_scale_BxSxK=(k_scale_BxSxK, SCALE_SPEC),
               v_scale_BxSxK=(v_scale_BxSxK, SCALE_SPEC))
  named = {k: v for k, v in named.items() if v[0] is not None}
  mesh = parallel.active_mesh() if impl != "reference" else None
  tiling = tiling_of(implementation)
  split_tiles = attention_api.split_tiles_for(
      q_BxQxHxD.shape, k_cache_BxSxKxD.shape, tiling=tiling)

  def attend(*arrays):
    out, mass_BxKxS = attention_api.scheduled_attention(
        scale=1.0, implementation=impl, head_mass=True,
        split_tiles=split_tiles,
        score_prefix=mass_prefix, score=mass_score,
        tiling=tiling,
        **dict(zip(named, arrays)))
    if mass_BxKxS is not None and mesh is not None:  # this shard's heads
      mass_BxKxS = jax.lax.all_gather(mass_BxKxS, "model", axis=1, tiled=True)
    return out, mass_BxKxS

  if mesh is not None:
    attend = parallel.shard_map(
        attend, mesh, tuple(spec for _, spec in named.values()),
        (heads, rows if mass_rows_BxQ is not None else None))
  out_BxQxHxD, mass_BxKxS = attend(*(x for x, _ in named.values()))
  if mass_BxKxS is None:
    return out_BxQxHxD, None
  if impl == "reference":  # partitioned by XLA, which would split a sum
    # over sharded heads into per-device sums + all-reduce: computed per
    # head on the head shards, then gathered.
    mass_BxKxS = parallel.constrain(
        parallel.constrain(mass_BxKxS, P("data", "model")), rows)
  return out_BxQxHxD, attention_api.sum_heads(mass_BxKxS)
