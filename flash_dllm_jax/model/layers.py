"""Building blocks: RMSNorm, linear layers through the dispatch point, the
embedding lookup, RoPE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import ops, quantize, roles

Initializer = Callable[..., jax.Array]


class RMSNorm(nn.Module):
  """w * (x * rsqrt(mean(x^2) + eps)), normalised in float32 then cast back."""

  eps: float
  param_dtype: jnp.dtype = jnp.float32
  implementation: str | None = None  # see flash_dllm_jax/ops/

  @nn.compact
  def __call__(self, x_NxE: jax.Array) -> jax.Array:
    scale_E = self.param("scale", nn.initializers.ones, (x_NxE.shape[-1],),
                         self.param_dtype)
    return ops.rms_norm(x_NxE, scale_E, eps=self.eps,
                        implementation=self.implementation)


class Linear(nn.Module):
  """y = x @ kernel (+ bias); kernel is stored [in, out]. gathered: x and y
  replicated over the mesh's "model" axis (see ops.linear).

  quantize (a format of flash_dllm_jax/quantize.py): the weight is stored
  as kernel_q [out, in] in 8 bits with float32 scale [out, Z] and runs
  through ops.quantized_linear; `weights_only` then returns
  (kernel_q, scale, bias) without computing, for the fused calls of Block.
  role: the kernel's (roles.py; default: column-parallel, quantized
  as a projection); the bias shares its shard.
  """

  features: int
  use_bias: bool = False
  gathered: bool = False
  param_dtype: jnp.dtype = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, "fan_in", "normal")
  quantize: str | None = None
  implementation: str | None = None  # see flash_dllm_jax/ops/
  role: roles.Role = roles.Role("columns", "projection")

  @nn.compact
  def __call__(self, x: jax.Array, weights_only: bool = False):
    roles.declare(self, "kernel", self.role)
    if self.use_bias:
      roles.declare(self, "bias", roles.Role(self.role.shard))
    # Declared after the kernel: Flax draws each parameter's init key in
    # declaration order, so the order fixes a random model's weights.
    bias = lambda: self.param("bias", nn.initializers.normal(0.1),
                              (self.features,), self.param_dtype
                              ) if self.use_bias else None
    if self.quantize is None:
      kernel = self.param("kernel", self.kernel_init,
                          (x.shape[-1], self.features), self.param_dtype)
      return ops.linear(x, kernel, bias(), gathered=self.gathered)
    # Shapes only: quantized weights come from quantize.quantize_params.
    fmt = quantize.get_format(self.quantize)
    kernel_q = self.param("kernel_q", nn.initializers.zeros,
                          (self.features, x.shape[-1]), fmt.dtype)
    scale = self.param("scale", nn.initializers.ones,
                       (self.features, quantize.scale_columns(
                           self.quantize, x.shape[-1])), jnp.float32)
    bias = bias()
    if weights_only:
      return kernel_q, scale, bias
    return ops.quantized_linear(x, kernel_q, scale, bias, fmt=self.quantize,
                                gathered=self.gathered,
                                implementation=self.implementation)


class QuantizedEmbed(nn.Module):
  """The 8-bit embedding's parameters, shapes only (quantize_params fills
  them): kernel_q [V, E] in format `quantize`'s dtype and float32 scale
  [V, 1]; returns them as the mapping embed_lookup takes."""

  vocab_size: int
  features: int
  quantize: str

  @nn.compact
  def __call__(self) -> dict[str, jax.Array]:
    dtype = quantize.get_format(self.quantize).dtype
    return {"kernel_q": self.param("kernel_q", nn.initializers.zeros,
                                   (self.vocab_size, self.features), dtype),
            "scale": self.param("scale", nn.initializers.ones,
                                (self.vocab_size, 1), jnp.float32)}


def embed_lookup(embed, tokens_BxQ: jax.Array, dtype) -> jax.Array:
  """x_BxQxE in `dtype`: the rows `tokens_BxQ` of the embedding as stored,
  a table [V, E] or {'kernel_q': w_VxE 8-bit, 'scale': scale_Vx1 float32}.
  An 8-bit table is never dequantized whole: the gathered rows are scaled
  by their gathered scales in float32 (each element is w * scale exactly,
  as a dequantized table would give) and cast to `dtype`."""
  if not isinstance(embed, Mapping):
    return jnp.take(embed, tokens_BxQ, axis=0).astype(dtype)
  w_BxQxE = jnp.take(embed["kernel_q"], tokens_BxQ, axis=0)
  scale_BxQx1 = jnp.take(embed["scale"], tokens_BxQ, axis=0)
  return (w_BxQxE.astype(jnp.float32) * scale_BxQx1).astype(dtype)


def rope_angles(positions_BxQ: jax.Array, rope_dim: int,
                theta: float) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, Q, R] in float32 for split-halves (rotate_half) RoPE
  over the first R = rope_dim dims of a head."""
  # A host constant (as torch computes it), never an XLA-fused pow that can
  # differ by an ulp between compilations.
  exponent = np.arange(0, rope_dim, 2, dtype=np.float32) / np.float32(rope_dim)
  inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(
      np.float32)
  freqs_BxQxR2 = positions_BxQ.astype(jnp.float32)[..., None] * inv_freq
  angles_BxQxR = jnp.concatenate([freqs_BxQxR2, freqs_BxQxR2], axis=-1)
  return jnp.cos(angles_BxQxR), jnp.sin(angles_BxQxR)


def apply_rope(x_BxQxHxD: jax.Array, cos_BxQxR: jax.Array,
               sin_BxQxR: jax.Array, in_float32: bool) -> jax.Array:
  """x * cos + rotate_half(x) * sin on the first R dims of each head (the
  rest pass through: partial RoPE).

  in_float32 (LLaDA): x is upcast and rotated in float32, then cast back.
  Otherwise (Dream): cos/sin are cast to x's dtype and the rotation runs there.
  """
  dtype = x_BxQxHxD.dtype
  r = cos_BxQxR.shape[-1]
  compute = jnp.float32 if in_float32 else dtype
  x = x_BxQxHxD[..., :r].astype(compute)
  cos = cos_BxQxR[:, :, None, :].astype(compute)
  sin = sin_BxQxR[:, :, None, :].astype(compute)
  half = r // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = (x * cos + rotated * sin).astype(dtype)
  if r == x_BxQxHxD.shape[-1]:
    return out
  return jnp.concatenate([out, x_BxQxHxD[..., r:]], axis=-1)
