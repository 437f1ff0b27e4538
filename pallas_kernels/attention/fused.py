"""JAX's fused attention (cuDNN's flash attention where it applies) with the
reference's semantics: the uncached forwards' attention on GPUs."""

import jax
import jax.numpy as jnp


def fused_attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid_BxS, *,
                    scale: float, xla_impl: str | None = None) -> jax.Array:
  """`jax.nn.dot_product_attention` with the reference's semantics: a row
  with no valid key averages all values uniformly (finite, as the reference
  models' additive mask gives).

  xla_impl: its `implementation`; None asks for cuDNN for 16-bit inputs
  (cuDNN takes no float32) and falls back to XLA's composition when JAX
  refuses the shapes. cuDNN wants the mask as a full [B, 1, Q, S] bias.
  key_valid: [B, S], or [B, Q, S] for a mask per query.
  """
  b, q = q_BxQxHxD.shape[:2]
  s = k_BxSxKxD.shape[1]
  valid_BxQxS = jnp.broadcast_to(
      key_valid_BxS if key_valid_BxS.ndim == 3 else key_valid_BxS[:, None],
      (b, q, s))
  any_valid_BxQ = jnp.any(valid_BxQxS, axis=-1)
  mask_Bx1xQxS = (valid_BxQxS | ~any_valid_BxQ[..., None])[:, None]
  attend = lambda impl: jax.nn.dot_product_attention(
      q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, mask=mask_Bx1xQxS, scale=scale,
      implementation=impl)
  if xla_impl is None and q_BxQxHxD.dtype in (jnp.bfloat16, jnp.float16):
    try:
      o_BxQxHxD = attend("cudnn")
    except (ValueError, NotImplementedError, RuntimeError):
      o_BxQxHxD = attend("xla")
  else:
    o_BxQxHxD = attend(xla_impl or "xla")
  g = q_BxQxHxD.shape[2] // k_BxSxKxD.shape[2]
  uniform_Bx1xHxD = jnp.repeat(
      jnp.mean(v_BxSxKxD.astype(jnp.float32), axis=1, keepdims=True), g,
      axis=2)
  return jnp.where(any_valid_BxQ[:, :, None, None], o_BxQxHxD,
                   uniform_Bx1xHxD.astype(o_BxQxHxD.dtype))
