"""Pallas (Triton) fused RoPE + in-place KV-cache write.

One program per (sequence b, fresh token i): it rotates the token's H query
heads and K key heads in float32 (cos/sin from position * inv_freq, computed in
the kernel, never materialised as [B, Q, D]), scales q, and stores the rotated
key and the value row into cache row `slots_BxQ[b, i]`. The caches are aliased
input -> output, so under `jax.jit(..., donate_argnums=...)` the write happens
in place and the untouched S - Q rows are never read or copied.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.cache_update import reference
from pallas_kernels.common import is_pow2, next_pow2


def _rotate_store(src_ref, dst_ref, dst_lead, row_mask, cos, sin, scale):
  """Rotates src_ref[:n_p] ([n_p, D], halves in float32) into dst_ref.

  dst_lead indexes dst_ref's leading dims (one indexer per access: the Triton
  lowering takes no nested `.at` views).
  """
  d = src_ref.shape[-1]
  half, n_p = d // 2, row_mask.shape[0]
  lo, hi, rows = pl.ds(0, half), pl.ds(half, half), pl.ds(0, n_p)
  mask = row_mask[:, None]
  x1 = plgpu.load(src_ref.at[rows, lo], mask=mask, other=0)
  x2 = plgpu.load(src_ref.at[rows, hi], mask=mask, other=0)
  x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
  o1 = (x1 * cos - x2 * sin) * scale
  o2 = (x2 * cos + x1 * sin) * scale
  plgpu.store(dst_ref.at[(*dst_lead, rows, lo)], o1.astype(dst_ref.dtype),
              mask=mask)
  plgpu.store(dst_ref.at[(*dst_lead, rows, hi)], o2.astype(dst_ref.dtype),
              mask=mask)


def _kernel(pos_ref, slot_ref, invf_ref, q_ref, k_ref, v_ref, _kc, _vc,
            qo_ref, kc_ref, vc_ref, *, scale, h, kh, s):
  """Refs: q/qo [H, D], k/v [K, D], caches [S, K, D], pos/slot scalars."""
  angle = pos_ref[()].astype(jnp.float32) * invf_ref[...]
  cos, sin = jnp.cos(angle)[None, :], jnp.sin(angle)[None, :]
  h_p, k_p = next_pow2(h), next_pow2(kh)
  _rotate_store(q_ref, qo_ref, (), jnp.arange(h_p) < h, cos, sin, scale)

  slot = slot_ref[()]
  ok = (slot >= 0) & (slot < s)
  row = jnp.where(ok, slot, 0)
  k_mask = (jnp.arange(k_p) < kh) & ok
  _rotate_store(k_ref, kc_ref, (row,), k_mask, cos, sin, 1.0)
  v = plgpu.load(v_ref.at[pl.ds(0, k_p), :], mask=k_mask[:, None], other=0)
  plgpu.store(vc_ref.at[row, pl.ds(0, k_p), :], v.astype(vc_ref.dtype),
              mask=k_mask[:, None])


@functools.partial(jax.jit, static_argnames=("theta", "scale", "interpret"))
def rope_write(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
               k_cache_BxSxKxD, v_cache_BxSxKxD, *, theta: float,
               scale: float = 1.0, interpret: bool = False):
  """Same contract as reference.rope_write; caches are updated in place.

  Raises NotImplementedError for shapes the Triton lowering can't tile.
  """
  b, q, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1], k_cache_BxSxKxD.shape[2]
  if not is_pow2(d) or d < 32:
    raise NotImplementedError(f"head_dim {d} must be a power of two >= 32")
  if k_BxQxKxD.shape != (b, q, kh, d) or v_BxQxKxD.shape != (b, q, kh, d):
    raise NotImplementedError("k/v must be [B, Q, K, D] matching the cache")
  if v_cache_BxSxKxD.shape != k_cache_BxSxKxD.shape:
    raise NotImplementedError("k and v caches must have the same shape")
  inv_freq_D2 = reference.rope_inv_freq(d, theta)
  tok = lambda bi, qi: (bi, qi)
  row = lambda n: pl.BlockSpec((None, None, n, d),
                               lambda bi, qi: (bi, qi, 0, 0))
  cache = pl.BlockSpec((None, s, kh, d), lambda bi, qi: (bi, 0, 0, 0))
  kernel = functools.partial(_kernel, scale=scale, h=h, kh=kh, s=s)
  return pl.pallas_call(
      kernel,
      grid=(b, q),
      in_specs=[pl.BlockSpec((None, None), tok),
                pl.BlockSpec((None, None), tok),
                pl.BlockSpec((d // 2,), lambda bi, qi: (0,)),
                row(h), row(kh), row(kh), cache, cache],
      out_specs=[row(h), cache, cache],
      out_shape=[jax.ShapeDtypeStruct(q_BxQxHxD.shape, q_BxQxHxD.dtype),
                 jax.ShapeDtypeStruct(k_cache_BxSxKxD.shape,
                                      k_cache_BxSxKxD.dtype),
                 jax.ShapeDtypeStruct(v_cache_BxSxKxD.shape,
                                      v_cache_BxSxKxD.dtype)],
      input_output_aliases={6: 1, 7: 2},
      compiler_params=plgpu.CompilerParams(num_warps=2, num_stages=1),
      interpret=interpret,
      name="rope_cache_write",
  )(positions_BxQ.astype(jnp.int32), slots_BxQ.astype(jnp.int32), inv_freq_D2,
    q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, k_cache_BxSxKxD, v_cache_BxSxKxD)
