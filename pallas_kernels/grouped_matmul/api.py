"""Public entry: the grouped GEMM, and the routed experts' SwiGLU MLP
through it (sort, gate/up, down, back), by kernel or reference.

implementation:
  'pallas' / 'pallas_interpret'  the Triton kernel (kernel.py).
  'mosaic' / 'mosaic_interpret'  the Mosaic GPU (Hopper: TMA, wgmma)
      kernel (mosaic.py), run in Mosaic GPU's interpret mode by
      'mosaic_interpret'; bf16 rows, bf16 or 8-bit stacks with
      per-channel scales. expert_mlp tiles its rows as
      mosaic.rows_per_tile picks from the routed rows; what it does not
      take runs 'pallas' / 'pallas_interpret' (with the Tiling given).
      Not the default: no measured table has it win yet.
  'reference'  reference.py.
  None         'pallas' on a GPU, 'reference' elsewhere.
The kernels raise NotImplementedError for what they do not take; the
caller then picks another path.
"""

import jax

from pallas_kernels import common
from pallas_kernels.grouped_matmul import kernel, layout, reference
from pallas_kernels.grouped_matmul.tiling import Tiling

TILE_M = Tiling().tile_m
IMPLEMENTATIONS = ("pallas", "pallas_interpret", "mosaic",
                   "mosaic_interpret", "reference")
MOSAIC = ("mosaic", "mosaic_interpret")


def resolve_implementation(implementation: str | None) -> str:
  """common.resolve_implementation with the Mosaic GPU names allowed."""
  return common.resolve_implementation(implementation, IMPLEMENTATIONS)


def _triton(impl: str) -> str:
  return "pallas_interpret" if impl.endswith("interpret") else "pallas"


def grouped_matmul(x_PxI: jax.Array, tile_expert: jax.Array, weight: tuple,
                   *, up: tuple | None = None, tile_m: int = TILE_M,
                   implementation: str | None = None, **tiling) -> jax.Array:
  """[P, O]: row tile g times expert tile_expert[g]'s weight (or the
  SwiGLU of weight and up), float32 sums in x's dtype; -1 tiles are zeros.
  weight/up: (kernel [X, I, O],) or (kernel_q [X, O, I], scale [X, O, Z]).
  tiling (kernel only): block_n, block_k, num_warps, num_stages for
  'pallas'; block_n, block_k for 'mosaic' (what it does not take runs
  Triton at its default tiling). Raises NotImplementedError for what the
  Triton kernel does not take (kernel.py)."""
  impl = resolve_implementation(implementation)
  if impl == "reference":
    return reference.grouped_matmul(x_PxI, tile_expert, weight, up=up,
                                    tile_m=tile_m)
  if impl in MOSAIC:
    # Imported here: Mosaic GPU's Python modules cost ~0.3 s to import.
    from pallas_kernels.grouped_matmul import mosaic
    try:
      return mosaic.grouped_matmul(x_PxI, tile_expert, weight, up=up,
                                   tile_m=tile_m,
                                   interpret=impl == "mosaic_interpret",
                                   **tiling)
    except NotImplementedError:
      impl, tiling = _triton(impl), {}
  return kernel.grouped_matmul(x_PxI, tile_expert, weight, up=up,
                               tile_m=tile_m,
                               interpret=impl == "pallas_interpret", **tiling)


def _mosaic_rows(x_TxE, n_pairs, gate, up, down) -> int | None:
  """The Mosaic kernel's tile_m for this call, or None where it does not
  take these stacks (decided from shapes and dtypes, never from P)."""
  from pallas_kernels.grouped_matmul import mosaic
  tm = mosaic.rows_per_tile(n_pairs, gate[0].shape[0])
  rows = lambda w: jax.ShapeDtypeStruct((tm, w), x_TxE.dtype)
  try:
    mosaic.check(rows(x_TxE.shape[1]), gate, up, tile_m=tm)
    mosaic.check(rows(down[0].shape[-2 if len(down) == 1 else -1]), down,
                 tile_m=tm)
  except NotImplementedError:
    return None
  return tm


def expert_mlp(x_TxE: jax.Array, expert_TxK: jax.Array, gate: tuple,
               up: tuple, down: tuple, *, tiling: Tiling = Tiling(),
               implementation: str | None = None) -> jax.Array:
  """y [T, K, E] in x's dtype: (silu(x Wg) * x Wu) Wd of each token's row
  through each of its K experts (expert_TxK, ids into the stacks' X);
  -0.0 for a pair whose expert is outside 0 .. X - 1 (held elsewhere).
  tiling: the Triton kernel's ('mosaic' picks its own)."""
  (t, e), k = x_TxE.shape, expert_TxK.shape[1]
  n_experts = gate[0].shape[0]
  impl = resolve_implementation(implementation)
  tile_m, kw = tiling.tile_m, tiling.kernel_args()
  if impl in MOSAIC:
    tm = _mosaic_rows(x_TxE, t * k, gate, up, down)
    if tm is None:
      impl = _triton(impl)
    else:
      tile_m, kw = tm, {}
  dest_N, tiles = layout.sort_pairs(expert_TxK.reshape(-1), n_experts,
                                    tile_m)
  p = tiles.shape[0] * tile_m
  x_PxE = layout.gather_rows(x_TxE, dest_N, k, p)
  run = lambda a, w, u=None: grouped_matmul(
      a, tiles, w, up=u, tile_m=tile_m, implementation=impl, **kw)
  y_PxE = run(run(x_PxE, gate, up), down)
  return layout.scatter_back(y_PxE, dest_N).reshape(t, k, e)
