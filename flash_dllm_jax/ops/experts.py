"""The routed experts of an MoE layer on one device's expert stacks: the
grouped kernel over the chosen (token, slot) pairs on a GPU, every expert
on every row elsewhere.

Dense (the reference path, and CPU): every row through every expert, C
experts at a time, each pair then taking its expert's row. Each element is
one dot product over one row and one expert's column; XLA:CPU's products
do not depend on the rows beside them at the row counts the tests use
(bitwise the same on any mesh there), though below about 256 rows or at an
unaligned count XLA:CPU may pick another product and move a row's last
bits. It costs every expert's FLOPs on every row.

Grouped (GPU 'pallas', or 'pallas_interpret'): pairs sorted by expert into
fixed tiles (pallas_kernels/grouped_matmul), K experts' FLOPs a row; its
rows are invariant too (kernel.py, and mosaic.py, Mosaic GPU's, under
Kernels(experts_backend="mosaic")). What the kernel does not take (widths
without a power-of-two tile, unusual scale groups) runs dense, and so does
a `Kernels` choice without expert tiling (training: the dense path is
differentiable).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.ops.choice import backend_name, expert_tiling
from pallas_kernels.grouped_matmul import api as grouped_api
from pallas_kernels.grouped_matmul.reference import dense_weight

# The most bytes of one chunk's [T, C, E] expert outputs (float32 sized):
# more experts than fit run C at a time in a loop.
EXPERT_CHUNK_BYTES = 1 << 28


def routed_experts(x_TxE: jax.Array, ids_TxK: jax.Array, first, stacks, *,
                   others: bool = False, implementation=None) -> jax.Array:
  """y [T, K, E] in x's dtype of the pairs whose expert is one of those
  `stacks` (gate, up, down: ExpertStack arrays, X' experts) hold, experts
  first .. first + X' - 1; with others (pairs may have other experts) the
  other pairs are -0.0."""
  impl = backend_name(implementation, "experts_backend")
  tiling = expert_tiling(implementation)
  if impl != "reference" and tiling is not None:
    try:
      return grouped_api.expert_mlp(
          x_TxE, ids_TxK - first, *stacks,
          tiling=tiling, implementation=impl)
    except NotImplementedError:
      pass
  return dense_experts(x_TxE, ids_TxK, first, stacks, others)


def expert_mlp(x_TxE: jax.Array, gate, up, down) -> jax.Array:
  """y [T, X, E] in x's dtype: every expert of the stacks (X of them) on
  every row, (silu(x Wg) * x Wu) Wd, each product accumulated in float32.

  Each element is one dot product over one row and one expert's column
  (a GEMM over [X * M] columns, then a batch over X of [T, M] x [M, E]),
  so a device holding some of the experts computes their elements as one
  device does."""
  def dot(spec, a, stack, upcast=False):
    w = dense_weight(stack, a.dtype)
    if upcast:  # exact: a bf16 value is a float32 value
      a, w = a.astype(jnp.float32), w.astype(jnp.float32)
    return jnp.einsum(spec, a, w, preferred_element_type=jnp.float32
                      ).astype(x_TxE.dtype)

  h_TxXxM = (jax.nn.silu(dot("te,xem->txm", x_TxE, gate))
             * dot("te,xem->txm", x_TxE, up))
  # XLA:CPU has no batched bf16 x bf16 -> float32 dot.
  return dot("txm,xme->txe", h_TxXxM, down,
             upcast=jax.default_backend() == "cpu")


def dense_experts(x_TxE: jax.Array, ids_TxK: jax.Array, first, stacks,
                  others: bool = False) -> jax.Array:
  """routed_experts by every expert on every row, C experts at a time."""
  (t, e), k = x_TxE.shape, ids_TxK.shape[1]
  n_local = stacks[0][0].shape[0]
  c = max([d for d in range(1, n_local + 1) if n_local % d == 0
           and t * d * e * 4 <= EXPERT_CHUNK_BYTES] or [1])
  local_TxK = ids_TxK - first

  def chunk(c0, stacks):
    """The pairs' outputs through experts c0 .. c0 + c - 1 (others: any)."""
    y_TxCxE = expert_mlp(x_TxE, *stacks)
    return jnp.take_along_axis(
        y_TxCxE, jnp.clip(local_TxK - c0, 0, c - 1)[..., None], axis=1)

  if c == n_local:
    y_TxKxE = chunk(0, stacks)
  else:
    def step(y_TxKxE, chunk_args):
      c0, stacks = chunk_args
      inside_TxK = (local_TxK >= c0) & (local_TxK < c0 + c)
      return jnp.where(inside_TxK[..., None], chunk(c0, stacks), y_TxKxE), None

    chunks = jax.tree.map(
        lambda a: a.reshape(n_local // c, c, *a.shape[1:]), stacks)
    y_TxKxE, _ = jax.lax.scan(step, jnp.zeros((t, k, e), x_TxE.dtype),
                              (jnp.arange(0, n_local, c), chunks))
  if not others:
    return y_TxKxE
  mine_TxK = (local_TxK >= 0) & (local_TxK < n_local)
  return jnp.where(mine_TxK[..., None], y_TxKxE,
                   jnp.asarray(-0.0, y_TxKxE.dtype))
