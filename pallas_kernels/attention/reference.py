"""Plain-JAX bidirectional attention with a key-validity mask and GQA.

Shapes follow flash_dllm_jax/shapes.py: B batch, Q queries, S keys, H query
heads, K key/value heads, J = H // K, D head dim; the word `tile` names an
axis of key tiles, of 64 keys each.

Sums over keys run tile by tile: each tile of KEY_TILE keys (counted from
key 0) is summed on its own, and the tile sums are added in key order,
starting from zero. A tile of masked keys adds exact zeros, so padding a
row on the left by whole tiles leaves every bit of its result unchanged
(XLA's own reduction over the key axis picks its order from the length).
"""

import jax
import jax.numpy as jnp

from pallas_kernels.attention import kv_quant

KEY_TILE = 64  # keys per tile of the key sums (tiling.PAD_ALIGN)


def _split_tiles(x: jax.Array, axis: int) -> jax.Array:
  """x zero-padded on the right of `axis` to whole key tiles, that axis
  split into (tile, KEY_TILE)."""
  n_tiles = -(-x.shape[axis] // KEY_TILE)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, n_tiles * KEY_TILE - x.shape[axis])
  x = jnp.pad(x, pad)
  axis %= x.ndim
  return x.reshape(x.shape[:axis] + (n_tiles, KEY_TILE) + x.shape[axis + 1:])


def key_tile_sum(parts: jax.Array, axis: int) -> jax.Array:
  """The per-tile terms along `axis` added one after another from zero, in
  key order: elementwise adds, unrolled (no inner loop in the decode's
  program), whose order XLA keeps."""
  total = jnp.zeros_like(jnp.take(parts, 0, axis=axis))
  for t in range(parts.shape[axis]):
    total = total + jnp.take(parts, t, axis=axis)
  return total


def normalise(e_BxKxJxQxY: jax.Array) -> jax.Array:
  """Softmax weights from e = exp(score - row max) (0 at masked keys): e
  over its tiled key sum; a row that sums to 0 stays 0."""
  y = e_BxKxJxQxY.shape[-1]
  e_BxKxJxQxtilex64 = _split_tiles(e_BxKxJxQxY, -1)
  # tree_sum, not jnp.sum: XLA:CPU's reduction changed its order with the
  # number of heads (a tensor-parallel shard's one KV head).
  l_BxKxJxQx1 = key_tile_sum(tree_sum(e_BxKxJxQxtilex64, axis=-1),
                             axis=-1)[..., None]
  e = e_BxKxJxQxtilex64.reshape(e_BxKxJxQxtilex64.shape[:4] + (-1,))
  return (e / jnp.where(l_BxKxJxQx1 > 0, l_BxKxJxQx1, 1.0))[..., :y]


def weighted_values(p_BxKxJxQxY: jax.Array, vals_BxYxKxD: jax.Array,
                    precision=None) -> jax.Array:
  """o_BxQxKxJxD = sum over keys of weight x value, float32, tiled: one
  matmul batched over (row, KV head, tile) contracting a tile's keys, then
  the tiles in key order."""
  parts_BxKxtilexJxQxD = jax.lax.dot_general(
      _split_tiles(p_BxKxJxQxY, -1), _split_tiles(vals_BxYxKxD, 1),
      (((5,), (2,)), ((0, 1, 4), (0, 3, 1))), precision=precision,
      preferred_element_type=jnp.float32)
  return key_tile_sum(parts_BxKxtilexJxQxD, axis=2).transpose(0, 3, 1, 2, 4)


def masked_attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
                     v_BxSxKxD: jax.Array, key_valid_BxS: jax.Array,
                     *, scale: float) -> jax.Array:
  """softmax(scale * q k^T + mask) v with float32 scores and accumulation.
  key_valid: [B, S] (every query alike) or [B, Q, S] (a mask per query).

  Invalid keys get the most negative finite float32 rather than -inf, so a row
  whose keys are all invalid yields a finite (uniform) average instead of NaN,
  as the additive `(1 - m) * finfo.min` mask of the reference models does.
  Query head h reads key/value head h // J (repeat_interleave grouping).
  """
  b, q, h, d = q_BxQxHxD.shape
  k = k_BxSxKxD.shape[2]
  q_BxQxKxJxD = q_BxQxHxD.reshape(b, q, k, h // k, d)
  s_BxKxJxQxS = jnp.einsum("bqkjd,bskd->bkjqs", q_BxQxKxJxD, k_BxSxKxD,
                           preferred_element_type=jnp.float32) * scale
  valid = (key_valid_BxS[:, None, None, None, :] if key_valid_BxS.ndim == 2
           else key_valid_BxS[:, None, None, :, :])
  s_BxKxJxQxS = jnp.where(valid, s_BxKxJxQxS, jnp.finfo(jnp.float32).min)
  e_BxKxJxQxS = jnp.exp(
      s_BxKxJxQxS - jnp.max(s_BxKxJxQxS, axis=-1, keepdims=True))
  p_BxKxJxQxS = normalise(e_BxKxJxQxS).astype(v_BxSxKxD.dtype)
  o_BxQxKxJxD = weighted_values(p_BxKxJxQxS, v_BxSxKxD)
  return o_BxQxKxJxD.reshape(b, q, h, d).astype(q_BxQxHxD.dtype)


def exclude_mask_from_positions(exclude_BxX: jax.Array, s: int) -> jax.Array:
  """Boolean [B, S] mask from a padded list of positions (-1 = padding)."""
  b = exclude_BxX.shape[0]
  cols_BxX = jnp.where((exclude_BxX >= 0) & (exclude_BxX < s), exclude_BxX, s)
  return jnp.zeros((b, s), bool).at[jnp.arange(b)[:, None], cols_BxX].set(
      True, mode="drop")


def tree_sum(x: jax.Array, axis: int) -> jax.Array:
  """Sums `axis` as a balanced tree of elementwise adds in a fixed order.

  XLA picks a reduction's order of float adds from the whole array shape, so
  `jnp.sum` could give a row other bits in a batch of another size, or a
  head shard other bits than the unsplit array. Here element i is paired
  with i + n/2 (zero-padded to a power of two n) until one is left: a
  handful of HLO adds whatever the length, where a chain of 95 adds
  (44cc9b6) preceded decode compiles that no longer finished in minutes on
  the H200 (suspected, not proven, BENCHMARKS.md).
  """
  n = x.shape[axis]
  width = 1 << max(0, n - 1).bit_length()
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, width - n)
  x = jnp.pad(x, pad)
  while x.shape[axis] > 1:
    half = x.shape[axis] // 2
    x = (jax.lax.slice_in_dim(x, 0, half, axis=axis)
         + jax.lax.slice_in_dim(x, half, 2 * half, axis=axis))
  return jnp.squeeze(x, axis)


def sum_heads(mass_BxKxS: jax.Array) -> jax.Array:
  """The attention mass summed over KV heads in one fixed order: callers
  under tensor parallelism gather every head's mass first, so each device
  (and one device alone) adds the same numbers in the same order."""
  return tree_sum(mass_BxKxS, axis=1)


def scheduled_attention(q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD, k_len_B,
                        q_len_B, *, scale: float, k_new_BxIxKxD=None,
                        v_new_BxIxKxD=None, inq_mask_BxQxI=None,
                        exclude_BxS=None, score_rows_BxQ=None,
                        head_mass: bool = False,
                        score_prefix: int | None = None,
                        score: str = "mass", k_scale_BxSxK=None,
                        v_scale_BxSxK=None):
  """Ragged bidirectional GQA attention over a cache plus in-query keys.

  Query i < q_len_B[b] of sequence b attends to cache slots s < k_len_B[b]
  that `exclude_BxS` does not mark, and to in-query key t where
  inq_mask_BxQxI[b, i, t]. Rows i >= q_len and rows with no key give zeros.
  Returns (o_BxQxHxD, mass_BxS or None); mass_BxS[b, s] sums softmax
  probabilities of cache key s over heads and over rows with score_rows_BxQ:
  per KV head first, then over heads by `sum_heads`. head_mass: return the
  per-head mass_BxKxS instead (to gather heads across devices first).
  score_prefix: only the first score_prefix queries can be score rows.
  score: "mass" sums softmax probabilities; "logit" sums the scaled
  pre-softmax q.k of each (score row, head) instead (Flash-dLLM's ranking).
  k_scale_BxSxK, v_scale_BxSxK: an 8-bit cache's per-slot scales
  (kv_quant.py): the cache is dequantized to float32 first.
  Plain JAX: builds the full mask and materialises float32 scores; key
  sums are tiled (module docstring).
  """
  if k_scale_BxSxK is not None:
    k_cache_BxSxKxD = kv_quant.dequantize(k_cache_BxSxKxD, k_scale_BxSxK)
    v_cache_BxSxKxD = kv_quant.dequantize(v_cache_BxSxKxD, v_scale_BxSxK)
  b, q, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1:3]
  f32, hi = jnp.float32, jax.lax.Precision.HIGHEST
  row_ok_BxQ = jnp.arange(q)[None, :] < q_len_B[:, None]
  key_ok_BxS = jnp.arange(s)[None, :] < k_len_B[:, None]
  if exclude_BxS is not None:
    key_ok_BxS &= ~exclude_BxS
  keys_BxYxKxD = jnp.where(key_ok_BxS[..., None, None], k_cache_BxSxKxD, 0)
  vals_BxYxKxD = jnp.where(key_ok_BxS[..., None, None], v_cache_BxSxKxD, 0)
  mask_BxQxY = row_ok_BxQ[:, :, None] & key_ok_BxS[:, None, :]
  if k_new_BxIxKxD is not None:
    keys_BxYxKxD = jnp.concatenate([keys_BxYxKxD, k_new_BxIxKxD], axis=1)
    vals_BxYxKxD = jnp.concatenate([vals_BxYxKxD, v_new_BxIxKxD], axis=1)
    inq_BxQxI = inq_mask_BxQxI & row_ok_BxQ[:, :, None]
    mask_BxQxY = jnp.concatenate([mask_BxQxY, inq_BxQxI], axis=2)
  q_BxQxKxJxD = q_BxQxHxD.reshape(b, q, kh, h // kh, d)
  s_BxKxJxQxY = jnp.einsum("bqkjd,bykd->bkjqy", q_BxQxKxJxD, keys_BxYxKxD,
                           preferred_element_type=f32, precision=hi) * scale
  mask = mask_BxQxY[:, None, None]
  s_BxKxJxQxY = jnp.where(mask, s_BxKxJxQxY, -jnp.inf)
  m = jnp.max(s_BxKxJxQxY, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  e_BxKxJxQxY = jnp.where(mask, jnp.exp(s_BxKxJxQxY - m), 0.0)
  p_BxKxJxQxY = normalise(e_BxKxJxQxY)
  o_BxQxKxJxD = weighted_values(p_BxKxJxQxY, vals_BxYxKxD.astype(f32),
                                precision=hi)
  o_BxQxHxD = o_BxQxKxJxD.reshape(b, q, h, d).astype(q_BxQxHxD.dtype)
  if score_rows_BxQ is None:
    return o_BxQxHxD, None
  if score_prefix is not None:
    score_rows_BxQ = score_rows_BxQ & (jnp.arange(q) < score_prefix)[None]
  w_BxQ = (score_rows_BxQ & row_ok_BxQ).astype(f32)
  if score == "logit":
    p_BxKxJxQxY = jnp.where(mask, s_BxKxJxQxY, 0.0)
  mass_BxKxS = jnp.einsum("bkjqs,bq->bks", p_BxKxJxQxY[..., :s], w_BxQ,
                          precision=hi)
  return o_BxQxHxD, mass_BxKxS if head_mass else sum_heads(mass_BxKxS)
