"""Plain-JAX KV-cache write: scatter fresh rows into a preallocated cache."""

import jax
import jax.numpy as jnp
import numpy as np


def write_rows(cache_BxSxKxD: jax.Array, new_BxQxKxD: jax.Array,
               positions_BxQ: jax.Array) -> jax.Array:
  """Returns the cache with row `positions_BxQ[b, i]` of sequence b replaced.

  Positions outside [0, S) (use -1 for padding queries) are dropped, so a
  ragged set of queries can be passed as a padded tensor.
  """
  s = cache_BxSxKxD.shape[1]
  positions_BxQ = jnp.where((positions_BxQ >= 0) & (positions_BxQ < s),
                            positions_BxQ, s)
  # vmapped: a scatter with a batch dimension, which XLA partitions along
  # rows (an explicit row index would make it gather the batch first).
  return jax.vmap(lambda c, n, p: c.at[p].set(n, mode="drop"))(
      cache_BxSxKxD, new_BxQxKxD.astype(cache_BxSxKxD.dtype), positions_BxQ)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
  """inv_freq [D/2] = 1 / theta^(2i/D) in float32, computed once in numpy.

  A host constant, so jitted and eager callers (and the kernel) see the same
  bits: an XLA-fused pow can differ by an ulp, which at position ~4000 moves
  the angle by ~1e-4 rad.
  """
  exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def rotate(x_BxQxNxD: jax.Array, positions_BxQ: jax.Array, theta: float,
           scale: float = 1.0) -> jax.Array:
  """Split-halves RoPE (x*cos + rotate_half(x)*sin) in float32, times scale."""
  d = x_BxQxNxD.shape[-1]
  freqs_BxQxD2 = (positions_BxQ.astype(jnp.float32)[..., None]
                  * rope_inv_freq(d, theta))
  cos_BxQx1xD2 = jnp.cos(freqs_BxQxD2)[:, :, None, :]
  sin_BxQx1xD2 = jnp.sin(freqs_BxQxD2)[:, :, None, :]
  x = x_BxQxNxD.astype(jnp.float32)
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  out = jnp.concatenate([x1 * cos_BxQx1xD2 - x2 * sin_BxQx1xD2,
                         x2 * cos_BxQx1xD2 + x1 * sin_BxQx1xD2], axis=-1)
  return (out * scale).astype(x_BxQxNxD.dtype)


def rope_write(q_BxQxHxD: jax.Array, k_BxQxKxD: jax.Array,
               v_BxQxKxD: jax.Array, positions_BxQ: jax.Array,
               slots_BxQ: jax.Array, k_cache_BxSxKxD: jax.Array,
               v_cache_BxSxKxD: jax.Array, *, theta: float,
               scale: float = 1.0):
  """RoPE q and k at `positions_BxQ`, scale q, write k and v at `slots_BxQ`.

  Returns (q_rotated_scaled_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD).
  Slots outside [0, S) (-1 = padding) are not written. Positions (RoPE angle)
  and slots (cache row) are separate because a cache may be laid out in a
  different order than the sequence.
  """
  q_out = rotate(q_BxQxHxD, positions_BxQ, theta, scale)
  k_rot = rotate(k_BxQxKxD, positions_BxQ, theta)
  return (q_out, write_rows(k_cache_BxSxKxD, k_rot, slots_BxQ),
          write_rows(v_cache_BxSxKxD, v_BxQxKxD, slots_BxQ))
