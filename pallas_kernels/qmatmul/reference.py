"""Plain-JAX matmul with 8-bit weights: the numerics every kernel matches.

A quantized weight is w_OxE (int8 or float8_e4m3fn, stored out x in as
cuBLASLt's fp8 GEMM wants it) with float32 scales scale_OxZ: Z = 1 is one
scale per output channel, Z = E / group one per group of `group` inputs.
The weight it stands for is w_OxE * scale_OxZ (each scale repeated over its
group).

activations "bf16": weight-only; x stays in its dtype.
activations "fp8": W8A8; each row of x is quantized to e4m3 with its own
scale (max |x| / 448, computed in float32), the products are of the 8-bit
values and both scales apply to the float32 sum.
"""

import jax
import jax.numpy as jnp

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0
INT8_MAX = 127.0


def quantize_rows(x_MxE: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(x_MxE in e4m3, scale_M float32): x ~= x_q * scale per row."""
  x = x_MxE.astype(jnp.float32)
  scale_M = jnp.max(jnp.abs(x), axis=-1) / FP8_MAX
  scale_M = jnp.where(scale_M > 0, scale_M, 1.0)
  return (x / scale_M[:, None]).astype(FP8), scale_M


def quantize(w_OxE: jax.Array, dtype, group: int | None = None
             ) -> tuple[jax.Array, jax.Array]:
  """(w_OxE in dtype, scale_OxZ float32), symmetric, max |w| to the format's
  largest value per output channel (group None) or per `group` inputs."""
  o, e = w_OxE.shape
  if group is not None and (group < 1 or e % group):
    raise ValueError(f"group {group} does not divide E = {e}")
  z = 1 if group is None else e // group
  w = w_OxE.astype(jnp.float32).reshape(o, z, e // z)
  top = INT8_MAX if jnp.dtype(dtype) == jnp.int8 else FP8_MAX
  scale_OxZ = jnp.max(jnp.abs(w), axis=-1) / top
  scale_OxZ = jnp.where(scale_OxZ > 0, scale_OxZ, 1.0)
  q = w / scale_OxZ[:, :, None]
  if jnp.dtype(dtype) == jnp.int8:
    q = jnp.clip(jnp.round(q), -INT8_MAX, INT8_MAX)
  return q.reshape(o, e).astype(dtype), scale_OxZ


def dequantize(w_OxE: jax.Array, scale_OxZ: jax.Array) -> jax.Array:
  """The float32 weight [O, E] a quantized weight stands for."""
  o, e = w_OxE.shape
  z = scale_OxZ.shape[1]
  w = w_OxE.astype(jnp.float32).reshape(o, z, e // z)
  return (w * scale_OxZ[:, :, None].astype(jnp.float32)).reshape(o, e)


def _product(x_MxE, w_OxE, scale_OxZ, activations):
  dot = lambda a, b: jax.lax.dot_general(
      a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
      precision=jax.lax.Precision.HIGHEST)
  if activations == "fp8":
    xq_MxE, sx_M = quantize_rows(x_MxE)
    return dot(xq_MxE.astype(jnp.float32),
               dequantize(w_OxE, scale_OxZ)) * sx_M[:, None]
  return dot(x_MxE.astype(jnp.float32), dequantize(w_OxE, scale_OxZ))


def matmul(x_MxE: jax.Array, w_OxE: jax.Array, scale_OxZ: jax.Array, *,
           w_up_OxE=None, scale_up_OxZ=None, residual_MxO=None,
           activations: str = "bf16") -> jax.Array:
  """x @ W^T, or silu(x @ W^T) * (x @ W_up^T), + residual, in x's dtype.

  float32 accumulation and epilogue.
  """
  if activations not in ("bf16", "fp8"):
    raise ValueError(f"activations must be 'bf16' or 'fp8', got "
                     f"{activations!r}")
  return epilogue(lambda w, s: _product(x_MxE, w, s, activations), w_OxE,
                  scale_OxZ, w_up_OxE, scale_up_OxZ, residual_MxO,
                  x_MxE.dtype)


def epilogue(product, w_OxE, scale_OxZ, w_up_OxE, scale_up_OxZ,
             residual_MxO, dtype):
  """product(w, scale) -> [M, O] float32; SwiGLU with the up weight when
  given, + residual, cast to `dtype` (shared by the XLA path)."""
  y_MxO = product(w_OxE, scale_OxZ)
  if w_up_OxE is not None:
    y_MxO = jax.nn.silu(y_MxO) * product(w_up_OxE, scale_up_OxZ)
  if residual_MxO is not None:
    y_MxO = y_MxO + residual_MxO.astype(jnp.float32)
  return y_MxO.astype(dtype)
