"""Plain-JAX bidirectional attention with a key-validity mask and GQA.

Shapes follow flash_dllm_jax/shapes.py: B batch, Q queries, S keys, H query
heads, K key/value heads, G = H // K, D head dim.
"""

import jax
import jax.numpy as jnp


def masked_attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
                     v_BxSxKxD: jax.Array, key_valid_BxS: jax.Array,
                     *, scale: float) -> jax.Array:
  """softmax(scale * q k^T + mask) v with float32 scores and accumulation.

  Invalid keys get the most negative finite float32 rather than -inf, so a row
  whose keys are all invalid yields a finite (uniform) average instead of NaN,
  as the additive `(1 - m) * finfo.min` mask of the reference models does.
  Query head h reads key/value head h // G (repeat_interleave grouping).
  """
  b, q, h, d = q_BxQxHxD.shape
  k = k_BxSxKxD.shape[2]
  q_BxQxKxGxD = q_BxQxHxD.reshape(b, q, k, h // k, d)
  s_BxKxGxQxS = jnp.einsum("bqkgd,bskd->bkgqs", q_BxQxKxGxD, k_BxSxKxD,
                           preferred_element_type=jnp.float32) * scale
  valid = key_valid_BxS[:, None, None, None, :]
  s_BxKxGxQxS = jnp.where(valid, s_BxKxGxQxS, jnp.finfo(jnp.float32).min)
  p_BxKxGxQxS = jax.nn.softmax(s_BxKxGxQxS, axis=-1)
  o_BxQxKxGxD = jnp.einsum("bkgqs,bskd->bqkgd",
                           p_BxKxGxQxS.astype(v_BxSxKxD.dtype), v_BxSxKxD,
                           preferred_element_type=jnp.float32)
  return o_BxQxKxGxD.reshape(b, q, h, d).astype(q_BxQxHxD.dtype)
