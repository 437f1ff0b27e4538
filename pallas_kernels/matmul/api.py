"""Public entry: small-M projection, Pallas kernel or plain-JAX reference."""

import jax

from pallas_kernels.common import resolve_implementation
from pallas_kernels.matmul import kernel, reference


def matmul(x_MxE: jax.Array, w_ExO: jax.Array, *, w_up_ExO=None,
           residual_MxO=None, implementation: str | None = None,
           **tiling) -> jax.Array:
  """x @ W (or silu(x @ W) * (x @ W_up)) + residual, float32 accumulation.

  implementation: 'pallas', 'pallas_interpret', 'reference', or None (pallas
  on GPU, reference elsewhere). M > 256 falls back to the reference.
  tiling: block_m, block_n, block_e, split_e, num_warps, num_stages.
  """
  impl = resolve_implementation(implementation)
  if impl != "reference":
    try:
      return kernel.matmul(x_MxE, w_ExO, w_up_ExO=w_up_ExO,
                           residual_MxO=residual_MxO,
                           interpret=impl == "pallas_interpret", **tiling)
    except NotImplementedError:
      pass
  return reference.matmul(x_MxE, w_ExO, w_up_ExO=w_up_ExO,
                          residual_MxO=residual_MxO)
