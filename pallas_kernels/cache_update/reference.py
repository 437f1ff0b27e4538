"""Plain-JAX KV-cache write: scatter fresh rows into a preallocated cache."""

import jax
import jax.numpy as jnp


def write_rows(cache_BxSxKxD: jax.Array, new_BxQxKxD: jax.Array,
               positions_BxQ: jax.Array) -> jax.Array:
  """Returns the cache with row `positions_BxQ[b, i]` of sequence b replaced.

  Positions outside [0, S) (use -1 for padding queries) are dropped, so a
  ragged set of queries can be passed as a padded tensor.
  """
  b = cache_BxSxKxD.shape[0]
  s = cache_BxSxKxD.shape[1]
  positions_BxQ = jnp.where((positions_BxQ >= 0) & (positions_BxQ < s),
                            positions_BxQ, s)
  rows_Bx1 = jnp.arange(b)[:, None]
  return cache_BxSxKxD.at[rows_Bx1, positions_BxQ].set(
      new_BxQxKxD.astype(cache_BxSxKxD.dtype), mode="drop")
