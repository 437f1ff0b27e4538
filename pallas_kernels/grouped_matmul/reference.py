"""Plain-JAX grouped GEMM: rows sorted by expert in tiles of tile_m rows,
each tile one expert's (tile_expert, -1 = an empty tile, all zeros).

Shapes: P padded rows (a multiple of tile_m), I inputs, O outputs, X
experts. A weight is (kernel [X, I, O],) or, 8-bit, (kernel_q [X, O, I],
scale [X, O, Z]) standing for kernel_q * scale (each scale over I / Z
inputs), as the model's ExpertStack stores it.
"""

import jax
import jax.numpy as jnp


def dense_weight(weight: tuple, dtype=jnp.float32) -> jax.Array:
  """[X, I, O] in dtype: a weight tuple, 8-bit ones dequantized."""
  if len(weight) == 1:
    return weight[0].astype(dtype)
  kernel_q, scale = weight
  x, o, i = kernel_q.shape
  w = (kernel_q.astype(jnp.float32).reshape(x, o, scale.shape[-1], -1)
       * scale[..., None]).reshape(x, o, i)
  return jnp.swapaxes(w, 1, 2).astype(dtype)


def grouped_matmul(x_PxI: jax.Array, tile_expert: jax.Array, weight: tuple,
                   *, up: tuple | None = None, tile_m: int) -> jax.Array:
  """[P, O] in x's dtype: each row tile times its expert's weight (or
  silu(x Wg) * (x Wu) with up), in float32; empty tiles are zeros."""
  p = x_PxI.shape[0]
  expert_P = jnp.repeat(tile_expert, tile_m, total_repeat_length=p)
  x = x_PxI.astype(jnp.float32)
  pick = jnp.maximum(expert_P, 0)[:, None, None]
  # Every row through every expert, then each row's own: [P, X, O] only.
  dot = lambda w: jnp.take_along_axis(jnp.einsum(
      "pi,xio->pxo", x, dense_weight(w),
      precision=jax.lax.Precision.HIGHEST), pick, axis=1)[:, 0]
  y_PxO = dot(weight)
  if up is not None:
    y_PxO = jax.nn.silu(y_PxO) * dot(up)
  y_PxO = jnp.where((expert_P >= 0)[:, None], y_PxO, 0.0)
  return y_PxO.astype(x_PxI.dtype)
