"""Plain-JAX small-M projection: x @ W with optional SwiGLU and residual.

M rows (tokens), E contraction width (model width, or F for down_proj), N
output features.
"""

import jax
import jax.numpy as jnp


def matmul(x_MxE: jax.Array, w_ExN: jax.Array, *, w_up_ExN=None,
           residual_MxN=None) -> jax.Array:
  """x @ W, or silu(x @ W) * (x @ W_up) when w_up_ExN is given, + residual.

  float32 accumulation and epilogue; the result is cast to x's dtype.
  """
  dot = lambda w: jnp.dot(x_MxE, w.astype(x_MxE.dtype),
                          preferred_element_type=jnp.float32,
                          precision=jax.lax.Precision.HIGHEST)
  y_MxN = dot(w_ExN)
  if w_up_ExN is not None:
    y_MxN = jax.nn.silu(y_MxN) * dot(w_up_ExN)
  if residual_MxN is not None:
    y_MxN = y_MxN + residual_MxN.astype(jnp.float32)
  return y_MxN.astype(x_MxE.dtype)
