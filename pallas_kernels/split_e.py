"""The split-E streaming GEMM skeleton shared by matmul and qmatmul.

Both kernels run a (row tiles, column tiles, E splits) grid: each program
sums its run of E blocks into float32 accumulators (two with SwiGLU) and
either finishes the tile (one split: activation, residual, output dtype) or
writes its float32 partial sums for the caller to add.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

SHARED_MEMORY_BUDGET = 180 << 10  # bytes of pipelined tiles per program


def silu(g):
  return g / (1.0 + jnp.exp(-g))


def block_range(e, be, splits, sp):
  """[t0, t1): the E blocks (of be) that split `sp` of `splits` sums."""
  n_e = pl.cdiv(e, be)
  per = pl.cdiv(n_e, splits)
  t0 = jnp.minimum(sp * per, n_e)
  return t0, jnp.minimum(t0 + per, n_e)


def pipeline_depth(bytes_per_stage: int) -> int:
  """The deepest pipeline (<= 4 stages) whose tiles fit the budget."""
  return max(1, min(4, SHARED_MEMORY_BUDGET // bytes_per_stage))


def outputs(m, o, splits, n_acc, dtype):
  """(out_shape, out_specs): the M x O result when one split finishes the
  tile, else each accumulator's float32 partial sums, splits x M x O."""
  if splits == 1:
    return ([jax.ShapeDtypeStruct((m, o), dtype)],
            [pl.BlockSpec((m, o), lambda i, j, k: (0, 0))])
  part = jax.ShapeDtypeStruct((splits, m, o), jnp.float32)
  spec = pl.BlockSpec((None, m, o), lambda i, j, k: (k, 0, 0))
  return [part] * n_acc, [spec] * n_acc


def store_tile(accs, out_refs, res_ref, rows, cols, mask, *, swiglu, final):
  """Writes one (bm, bn) tile: the partial sums, or (final) silu(gate) * up
  (SwiGLU) or the sum, plus the residual, in the output's dtype."""
  if not final:
    for acc, ref in zip(accs, out_refs):
      plgpu.store(ref.at[rows, cols], acc, mask=mask)
    return
  y = silu(accs[0]) * accs[1] if swiglu else accs[0]
  if res_ref is not None:
    y += plgpu.load(res_ref.at[rows, cols], mask=mask,
                    other=0.0).astype(jnp.float32)
  plgpu.store(out_refs[0].at[rows, cols], y.astype(out_refs[0].dtype),
              mask=mask)


def launch(kernel, args, grid, outs, *, name, interpret, num_warps,
           num_stages):
  """pallas_call of `kernel` over `grid` with every input passed whole (each
  program loads its own masked tiles); outs is outputs(...)."""
  whole = lambda a: pl.BlockSpec(a.shape, lambda i, j, k: (0,) * a.ndim)
  out_shape, out_specs = outs
  return pl.pallas_call(
      kernel, grid=grid, in_specs=[whole(a) for a in args],
      out_specs=out_specs, out_shape=out_shape, interpret=interpret,
      name=name, compiler_params=plgpu.CompilerParams(
          num_warps=num_warps, num_stages=num_stages))(*args)
