"""The one dispatch point between model code and `pallas_kernels`.

Model code calls these functions and never imports a kernel. Each picks a
Pallas kernel where one exists for the backend and shape, and the plain-JAX
reference otherwise.
"""

import jax
import jax.numpy as jnp

from pallas_kernels.attention import reference as attention_reference
from pallas_kernels.cache_update import reference as cache_reference


def linear(x_NxE: jax.Array, kernel_ExF: jax.Array,
           bias_F: jax.Array | None = None) -> jax.Array:
  """x @ W (+ b) in x's dtype, accumulating in float32."""
  y = jnp.einsum("...e,ef->...f", x_NxE, kernel_ExF.astype(x_NxE.dtype),
                 preferred_element_type=jnp.float32)
  if bias_F is not None:
    y = y + bias_F.astype(jnp.float32)
  return y.astype(x_NxE.dtype)


def attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
              v_BxSxKxD: jax.Array, key_valid_BxS: jax.Array,
              *, scale: float) -> jax.Array:
  """Bidirectional GQA attention of queries over keys with a validity mask."""
  return attention_reference.masked_attention(
      q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid_BxS, scale=scale)


def write_cache(cache_BxSxKxD: jax.Array, new_BxQxKxD: jax.Array,
                positions_BxQ: jax.Array) -> jax.Array:
  """Writes fresh K or V rows at their absolute positions (-1 = skip)."""
  return cache_reference.write_rows(cache_BxSxKxD, new_BxQxKxD, positions_BxQ)
