"""Plain-JAX small-M projection: x @ W with optional SwiGLU and residual.

M rows (tokens), E contraction width (model width, or F for down_proj), N
output features.
"""

import jax
import jax.numpy as jnp


def matmul(x_MxE: jax.Array, w_ExO: jax.Array, *, w_up_ExO=None,
           residual_MxO=None) -> jax.Array:
  """x @ W, or silu(x @ W) * (x @ W_up) when w_up_ExO is given, + residual.

  float32 accumulation and epilogue; the result is cast to x's dtype.
  """
  dot = lambda w: jnp.dot(x_MxE, w.astype(x_MxE.dtype),
                          preferred_element_type=jnp.float32,
                          precision=jax.lax.Precision.HIGHEST)
  y_MxO = dot(w_ExO)
  if w_up_ExO is not None:
    y_MxO = jax.nn.silu(y_MxO) * dot(w_up_ExO)
  if residual_MxO is not None:
    y_MxO = y_MxO + residual_MxO.astype(jnp.float32)
  return y_MxO.astype(x_MxE.dtype)
