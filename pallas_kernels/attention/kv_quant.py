"""8-bit KV cache rows: one scale per (row, slot, KV head).

A K or V vector of D values is stored as D 8-bit values (float8 e4m3 or
int8) times one bfloat16 scale, amax / FORMAT_MAX. The scale belongs to the
vector alone, so writing a slot never rescales another slot, and a row's
cache never depends on the other rows. Dequantized: value.astype(f32) *
scale. Both 8-bit formats convert to bfloat16 exactly, so the kernel feeds
them to its bf16 matmuls as they are and applies the scales to the scores
(K) and to the probabilities (V).
"""

import jax
import jax.numpy as jnp

# Largest finite value of each 8-bit cache format.
FORMAT_MAX = {"float8_e4m3fn": 448.0, "int8": 127.0}
SCALE_DTYPE = jnp.bfloat16


def is_quantized(dtype) -> bool:
  return jnp.dtype(dtype).name in FORMAT_MAX


def quantize(x_BxQxKxD: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """(values_BxQxKxD in `dtype`, scale_BxQxK in SCALE_DTYPE) of vectors
  along the last axis. The scale is rounded to its dtype first and the
  values divided by the rounded scale (clipped, so rounding never
  overflows the format); an all-zero vector gets scale 1."""
  dtype = jnp.dtype(dtype)
  top = FORMAT_MAX[dtype.name]
  x = x_BxQxKxD.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=-1)
  scale = jnp.where(amax > 0, amax / top, 1.0).astype(SCALE_DTYPE)
  y = jnp.clip(x / scale.astype(jnp.float32)[..., None], -top, top)
  if dtype == jnp.int8:
    y = jnp.round(y)
  return y.astype(dtype), scale


def dequantize(values_BxSxKxD: jax.Array, scale_BxSxK: jax.Array,
               dtype=jnp.float32) -> jax.Array:
  """values * scale in `dtype` (the reference's float32 by default)."""
  return (values_BxSxKxD.astype(jnp.float32)
          * scale_BxSxK.astype(jnp.float32)[..., None]).astype(dtype)
