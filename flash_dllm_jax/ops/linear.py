"""Projections: bf16 weights through XLA's dot, 8-bit weights through the
streaming kernel or XLA's GEMM (pallas_kernels/qmatmul)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel, quantize
from flash_dllm_jax.ops.choice import Kernels, backend_name
from pallas_kernels.qmatmul import api as qmatmul_api


def linear(x_MxE: jax.Array, kernel_ExO: jax.Array,
           bias_O: jax.Array | None = None, *, gathered: bool = False
           ) -> jax.Array:
  """x @ W (+ b) in x's dtype, accumulating in float32.

  On a GPU, without a bias, the product is asked for in x's dtype directly:
  cuBLAS accumulates in float32 and rounds once on output, what the float32
  product and a cast give, but without writing the float32 product and
  converting it in another kernel (3 converts a layer for q/k/v, and SwiGLU
  reading float32 gate/up).
  Elsewhere, and under tensor parallelism, the product stays float32:
  XLA:CPU's bf16 dots on a tensor-parallel shard gave other values than one
  device's (tests/test_mesh_exact), and a GPU's were not checked there.

  XLA's dot: the Pallas small-M matmul wins only at M = 1 on the H200 and
  loses from M = 32 on, while decode steps run B x Q >= 16 rows.
  gathered (under a mesh, for a kernel column-sharded over "model"): x is
  all-gathered over "model" first and each device's output columns after,
  rows staying on "data". Every element is then one full-length dot
  product, as on one device; a row-sharded kernel would sum per-device
  partial products by an all-reduce, in another order.
  """
  active = parallel.active_mesh()
  mesh = active if gathered else None
  rows = P("data")
  if mesh is not None:
    x_MxE = jax.lax.with_sharding_constraint(x_MxE, rows)
  direct = (bias_O is None and jax.default_backend() == "gpu"
            and (active is None or active.shape["model"] == 1))
  y = jnp.einsum("...e,eo->...o", x_MxE, kernel_ExO.astype(x_MxE.dtype),
                 preferred_element_type=x_MxE.dtype if direct else jnp.float32)
  if mesh is not None and y.shape[-1] % mesh.shape["model"] == 0:
    # Computed on the kernel's column shard: never all-gather the weight.
    y = jax.lax.with_sharding_constraint(
        y, P("data", *[None] * (y.ndim - 2), "model"))
  if bias_O is not None:
    y = y + bias_O.astype(jnp.float32)
  y = y.astype(x_MxE.dtype)
  return y if mesh is None else jax.lax.with_sharding_constraint(y, rows)


# Rows per sequence (Q of x [B, Q, E]) up to which a GPU runs the
# weight-streaming kernel; above it XLA's GEMM. Chosen by Q and the format's
# activations, never by B x Q, so that which kernel a row gets, and so its
# bits, never depends on the batch. W8A8 (fp8 rows) takes cuBLASLt's fp8
# GEMM at every Q: the whole Flash-dLLM step was no slower at batch 1 and
# much faster at batch 32 than with the kernel for the small passes
# (BENCHMARKS.md, "8-bit weights").
QMATMUL_STREAM_MAX_Q = 64
QMATMUL_W8A8_STREAM_MAX_Q = 0


def stream_max_q(fmt: str, implementation=None) -> int:
  """The Q up to which format `fmt` streams (Kernels.stream_max_q wins)."""
  limit = getattr(implementation, "stream_max_q", None)
  if limit is not None:
    return limit
  if quantize.activations(fmt) == "fp8":
    return QMATMUL_W8A8_STREAM_MAX_Q
  return QMATMUL_STREAM_MAX_Q


def quantized_linear(x_BxQxE: jax.Array, w_OxE: jax.Array,
                     scale_OxZ: jax.Array, bias_O: jax.Array | None = None,
                     *, fmt: str, up: tuple[jax.Array, jax.Array] | None = None,
                     residual_BxQxO: jax.Array | None = None,
                     gathered: bool = False,
                     implementation: "str | Kernels | None" = None
                     ) -> jax.Array:
  """x @ W^T (+ b), or silu(x @ W^T) * (x @ W_up^T) with up=(w_up, scale_up),
  plus residual_BxQxO, for 8-bit weights (quantize.py) in x's dtype.

  x is [..., Q, E], Q the rows of one sequence. On CPU the plain-JAX
  reference, with the activations the format has on the H200 (fp8 W8A8
  for "fp8"). On a GPU the weight-streaming kernel when Q <=
  stream_max_q(fmt, implementation) and XLA's GEMM above; the kernel is
  Triton's, or Mosaic GPU's with Kernels(qmatmul="mosaic").
  Under a mesh the weight is column-sharded over "model" like ops.linear's:
  the kernel runs per shard (rows on "data", its output columns on
  "model"); gathered gathers x before and the output columns after, so
  every element is the one-device dot product.
  """
  impl = backend_name(implementation, "qmatmul")
  if impl in ("pallas", "mosaic") and x_BxQxE.shape[-2] > stream_max_q(
      fmt, implementation):
    impl = "xla"
  acts = quantize.activations(fmt)
  o, ndim = w_OxE.shape[0], x_BxQxE.ndim
  mesh = parallel.active_mesh()
  col = "model" if mesh is not None and o % mesh.shape["model"] == 0 else None
  out_spec = P("data", *[None] * (ndim - 2), col)

  def product(x, w, s, b, w_up, s_up, residual):
    lead, o_local = x.shape[:-1], w.shape[0]
    x_MxE = x.reshape(-1, x.shape[-1])
    r_MxO = None if residual is None else residual.reshape(-1, o_local)
    if b is not None:
      b_MxO = jnp.broadcast_to(b, (x_MxE.shape[0], o_local))
      r_MxO = b_MxO if r_MxO is None else r_MxO + b_MxO
    y_MxO = qmatmul_api.matmul(x_MxE, w, s, w_up_OxE=w_up, scale_up_OxZ=s_up,
                               residual_MxO=r_MxO, activations=acts,
                               implementation=impl)
    return y_MxO.reshape(*lead, o_local)

  w_up, s_up = up if up is not None else (None, None)
  if mesh is None:
    return product(x_BxQxE, w_OxE, scale_OxZ, bias_O, w_up, s_up,
                   residual_BxQxO)
  # Whole rows of x and of the residual in, column shards out. Left free,
  # XLA propagated the residual add's column split back into the residual
  # stream, whose norms then summed over E across devices.
  rows = lambda a: None if a is None else (
      jax.lax.with_sharding_constraint(a, P("data")))
  args = (rows(x_BxQxE), w_OxE, scale_OxZ, bias_O, w_up, s_up,
          rows(residual_BxQxO))
  if impl in ("reference", "xla"):  # partitioned by XLA
    y = jax.lax.with_sharding_constraint(product(*args), out_spec)
  else:
    specs = (P("data"), P(col, None), P(col, None), P(col), P(col, None),
             P(col, None), out_spec)
    present = [i for i, a in enumerate(args) if a is not None]

    def shard(*arrays):
      full = [None] * len(args)
      for i, a in zip(present, arrays):
        full[i] = a
      return product(*full)

    y = parallel.shard_map(shard, mesh, tuple(specs[i] for i in present),
                           out_spec)(*(args[i] for i in present))
  return jax.lax.with_sharding_constraint(y, P("data")) if gathered else y
