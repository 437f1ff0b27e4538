"""Plain-JAX RMSNorm: the definition the kernel must match."""

import jax
import jax.numpy as jnp


def rms_norm(x_NxE: jax.Array, scale_E: jax.Array, *, eps: float
             ) -> jax.Array:
  """scale * (x * rsqrt(mean(x^2) + eps)) per row, normalised in float32,
  cast back to x's dtype before the scale (as LLaDA and Dream do).

  XLA picks the order of the sum over E per fusion: on the H200 one device
  and a tensor-parallel mesh fused it differently and the last bit moved
  (2026-11-30). The kernel fixes the order.
  """
  x32 = x_NxE.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return x32.astype(x_NxE.dtype) * scale_E.astype(x_NxE.dtype)
