"""DiffusionGemma under a mesh's "model" axis: where activations are
gathered or split so that every value is one device's, bit for bit.

The weights are split as config.param_roles says. A projection split by
output (q/k/v heads, gate/up width) computes whole dot products per
device; its consumers across the split (attn_vec over the heads, the
MLPs' down over the width) take their input gathered over "model" and
keep their output columns on their device until these are gathered too
(`gather`), so no float sum crosses devices (a split contraction would
add per-device partial sums by an all-reduce, in another order). The
experts run where they live (`experts`). Outside a mesh with "model" > 1
everything here is the identity.

The batch dimension is left to XLA (PartitionSpec.UNCONSTRAINED): the
same code runs batched and one row at a time (model.forward_rows).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel

_FREE = P.UNCONSTRAINED


def ways() -> int:
  """The "model" size of the mesh being traced under (1: none)."""
  mesh = parallel.active_mesh()
  return 1 if mesh is None else mesh.shape["model"]


def gather(x):
  """x whole on every "model" device (its rows left to XLA)."""
  if ways() == 1:
    return x
  return jax.lax.with_sharding_constraint(x, P(_FREE, *[None] * (x.ndim - 1)))


def split(x, axis: int):
  """x split over "model" along `axis` (whole where `axis` does not
  divide: a global layer's kv heads)."""
  m = ways()
  if m == 1:
    return x
  spec = [_FREE] + [None] * (x.ndim - 1)
  if x.shape[axis] % m == 0:
    spec[axis] = "model"
  return jax.lax.with_sharding_constraint(x, P(*spec))


def columns(fn: Callable[[], jax.Array]) -> jax.Array:
  """fn()'s output [..., O] computed on the weight's output-column shard
  (the input was gathered), then gathered."""
  y = fn()
  if ways() == 1:
    return y
  return gather(split(y, y.ndim - 1))


def experts(run: Callable, m, x_TxD, ids_Txk, n_experts: int):
  """y [T, k, D] of `run(m, x, ids)` (each (token, slot)'s expert output)
  with the expert stacks of `m` split over "model": each device runs its
  own experts on every pair (ids shifted to its first expert), keeps the
  pairs routed to them and sets the others to -0.0; a psum over "model"
  then gives each pair its one device's value (v + -0.0 is v, signed
  zeros included). No expert weight leaves its device."""
  mesh = parallel.active_mesh()
  m_ways = ways()
  if m_ways == 1:
    return run(m, x_TxD, ids_Txk)
  local = n_experts // m_ways

  def shard(m, x, ids):
    first = jax.lax.axis_index("model") * local
    own = (ids >= first) & (ids < first + local)
    y = run(m, x, jnp.where(own, ids - first, local))
    y = jnp.where(own[..., None], y, jnp.array(-0.0, y.dtype))
    return jax.lax.psum(y, "model")

  stacks = jax.tree.map(lambda a: P("model", *[None] * (a.ndim - 1)), m)
  # A GPU's batched pass splits its tokens over "data" (the grouped GEMM's
  # tiles never depend on the row count); elsewhere (a row at a time, whose
  # tokens XLA:CPU may round otherwise in halves) every device takes all.
  gpu = jax.default_backend() in ("gpu", "cuda")
  rows = (P("data") if gpu and x_TxD.shape[0] % mesh.shape["data"] == 0
          else P())
  return parallel.shard_map(shard, mesh, (stacks, rows, rows), rows)(
      m, x_TxD, ids_Txk)
