"""Plain-JAX token log-probabilities: the definition the kernel must match."""

import jax
import jax.numpy as jnp


def token_logprob(logits_NxV: jax.Array, tokens_N: jax.Array) -> jax.Array:
  """[N] float32 log softmax(logits[n])[tokens[n]].

  XLA picks the order of the sum over V from the array's shape (on the H200
  a 9-row and a 17-row call differed in the last bit), so this is exact
  per row only for one N; the kernel fixes the order.
  """
  log_p_NxV = jax.nn.log_softmax(logits_NxV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(log_p_NxV, tokens_N[:, None], -1)[:, 0]
