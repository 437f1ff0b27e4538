"""Public entry: matmul with 8-bit weights, by kernel or plain-JAX reference.

implementation:
  'reference'         reference.matmul (float32 throughout).
  'xla'               XLA's dot: W8A8 as lax.dot_general of two e4m3
                      operands contracting both dims 1 (cuBLASLt's fp8 GEMM
                      on Hopper), weight-only as the weight converted to x's
                      dtype inside the jit and a dot in that dtype.
  'pallas' / 'pallas_interpret'
                      the weight-streaming kernel (kernel.py), which reads
                      1-byte weights and dequantizes in registers; shapes it
                      does not take fall through to 'xla'.
  None                'pallas' on a GPU, 'reference' elsewhere.
"""

import jax

from pallas_kernels.qmatmul import reference


def matmul(x_MxE: jax.Array, w_OxE: jax.Array, scale_OxZ: jax.Array, *,
           w_up_OxE=None, scale_up_OxZ=None, residual_MxO=None,
           activations: str = "bf16", implementation: str | None = None,
           **tiling) -> jax.Array:
  """Same contract as reference.matmul."""
  del implementation, tiling  # the kernels land next to this reference
  return reference.matmul(x_MxE, w_OxE, scale_OxZ, w_up_OxE=w_up_OxE,
                          scale_up_OxZ=scale_up_OxZ, residual_MxO=residual_MxO,
                          activations=activations)
