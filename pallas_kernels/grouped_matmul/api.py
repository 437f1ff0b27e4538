"""Public entry: the grouped GEMM, and the routed experts' SwiGLU MLP
through it (sort, gate/up, down, back), by kernel or reference.

implementation: 'pallas', 'pallas_interpret', 'reference', or None
(pallas on GPU, reference elsewhere). The kernel raises
NotImplementedError for what it does not take; the caller then picks
another path.
"""

import jax

from pallas_kernels.common import resolve_implementation
from pallas_kernels.grouped_matmul import kernel, layout, reference
from pallas_kernels.grouped_matmul.tiling import Tiling

TILE_M = Tiling().tile_m


def grouped_matmul(x_PxI: jax.Array, tile_expert: jax.Array, weight: tuple,
                   *, up: tuple | None = None, tile_m: int = TILE_M,
                   implementation: str | None = None, **tiling) -> jax.Array:
  """[P, O]: row tile g times expert tile_expert[g]'s weight (or the
  SwiGLU of weight and up), float32 sums in x's dtype; -1 tiles are zeros.
  weight/up: (kernel [X, I, O],) or (kernel_q [X, O, I], scale [X, O, Z]).
  tiling (kernel only): block_n, block_k, num_warps, num_stages. Raises
  NotImplementedError for what the kernel does not take (kernel.py)."""
  impl = resolve_implementation(implementation)
  if impl == "reference":
    return reference.grouped_matmul(x_PxI, tile_expert, weight, up=up,
                                    tile_m=tile_m)
  return kernel.grouped_matmul(x_PxI, tile_expert, weight, up=up,
                               tile_m=tile_m,
                               interpret=impl == "pallas_interpret", **tiling)


def expert_mlp(x_TxE: jax.Array, expert_TxK: jax.Array, gate: tuple,
               up: tuple, down: tuple, *, tiling: Tiling = Tiling(),
               implementation: str | None = None) -> jax.Array:
  """y [T, K, E] in x's dtype: (silu(x Wg) * x Wu) Wd of each token's row
  through each of its K experts (expert_TxK, ids into the stacks' X);
  -0.0 for a pair whose expert is outside 0 .. X - 1 (held elsewhere)."""
  (t, e), k = x_TxE.shape, expert_TxK.shape[1]
  n_experts, tile_m = gate[0].shape[0], tiling.tile_m
  dest_N, tiles = layout.sort_pairs(expert_TxK.reshape(-1), n_experts,
                                    tile_m)
  p = tiles.shape[0] * tile_m
  x_PxE = layout.gather_rows(x_TxE, dest_N, k, p)
  run = lambda a, w, u=None: grouped_matmul(
      a, tiles, w, up=u, tile_m=tile_m, implementation=implementation,
      **tiling.kernel_args())
  y_PxE = run(run(x_PxE, gate, up), down)
  return layout.scatter_back(y_PxE, dest_N).reshape(t, k, e)
