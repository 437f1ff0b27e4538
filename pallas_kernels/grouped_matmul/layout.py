"""The expert-sorted, tile-padded row order of (token, slot) pairs.

N pairs, each with an expert id; X experts. Pairs are ordered by expert
(stable: by pair index within an expert) and each expert's run is padded
up to a multiple of tile_m rows, so that every row tile belongs to one
expert. P, the padded row count, is a static bound: each expert with pairs
pads at most tile_m - 1 rows.
"""

import jax
import jax.numpy as jnp


def padded_rows(n_pairs: int, n_experts: int, tile_m: int) -> int:
  """P: n_pairs + (tile_m - 1) per expert that can have pairs, rounded up
  to tile_m."""
  bound = n_pairs + min(n_experts, n_pairs) * (tile_m - 1)
  return max(tile_m, -(-bound // tile_m) * tile_m)


def sort_pairs(expert_N: jax.Array, n_experts: int, tile_m: int
               ) -> tuple[jax.Array, jax.Array]:
  """(dest_N, tile_expert [P / tile_m]): each pair's padded row (P for a
  pair whose expert is outside 0 .. X - 1: it has none) and each row
  tile's expert (-1: empty)."""
  n = expert_N.shape[0]
  p = padded_rows(n, n_experts, tile_m)
  key_N = jnp.where((expert_N >= 0) & (expert_N < n_experts), expert_N,
                    n_experts).astype(jnp.int32)
  order_N = jnp.argsort(key_N, stable=True)
  counts = jnp.zeros((n_experts + 1,), jnp.int32).at[key_N].add(1)
  starts = jnp.cumsum(counts) - counts
  padded_X = (counts[:n_experts] + tile_m - 1) // tile_m * tile_m
  ends_X = jnp.cumsum(padded_X)
  pstarts_X = ends_X - padded_X
  sorted_key = key_N[order_N]
  rank = jnp.arange(n, dtype=jnp.int32) - starts[sorted_key]
  local = sorted_key < n_experts
  dest_sorted = jnp.where(
      local, pstarts_X[jnp.minimum(sorted_key, n_experts - 1)] + rank, p)
  dest_N = jnp.zeros((n,), jnp.int32).at[order_N].set(dest_sorted)
  first_rows = jnp.arange(p // tile_m, dtype=jnp.int32) * tile_m
  tile = jnp.searchsorted(ends_X, first_rows, side="right").astype(jnp.int32)
  return dest_N, jnp.where(tile < n_experts, tile, -1)


def gather_rows(x_TxI: jax.Array, dest_N: jax.Array, per_token: int,
                p: int) -> jax.Array:
  """x_PxI: pair n's token row (n // per_token) at row dest_N[n]; padding
  rows are zeros."""
  t = x_TxI.shape[0]
  token_N = jnp.arange(dest_N.shape[0], dtype=jnp.int32) // per_token
  row_P = jnp.full((p,), t, jnp.int32).at[dest_N].set(token_N, mode="drop")
  x_ext = jnp.concatenate([x_TxI, jnp.zeros((1, x_TxI.shape[1]),
                                            x_TxI.dtype)])
  return x_ext[row_P]


def scatter_back(y_PxO: jax.Array, dest_N: jax.Array, fill=-0.0
                 ) -> jax.Array:
  """y_NxO: each pair's row of y_PxO; `fill` for pairs without a row."""
  p = y_PxO.shape[0]
  y_NxO = y_PxO[jnp.minimum(dest_N, p - 1)]
  return jnp.where((dest_N < p)[:, None], y_NxO,
                   jnp.asarray(fill, y_PxO.dtype))
