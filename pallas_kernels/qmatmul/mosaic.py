"""Pallas Mosaic GPU (Hopper) weight-streaming matmul with 8-bit weights.

The same product as kernel.py (Triton) for few rows: y = x @ (w * scale)^T
with bf16 rows x [M, E] and 1-byte weights w [O, E] (int8 or e4m3, one
float32 scale per output channel). wgmma's M side is 64 rows, so the kernel
computes the transpose, y^T = w @ x^T: a program owns a block_o slice of O
(wgmma's M) and streams its weight through shared memory with TMA
(plgpu.emit_pipeline), converts each [block_o, block_e] tile to bf16 into a
swizzled shared-memory tile and runs wgmma against x^T's [block_e, block_m]
tiles (x^T, zero-padded to a multiple of block_m rows, is made by XLA).
Rows are wgmma's N side in tiles of block_m, one float32 accumulator each,
all fed by the one converted weight tile.

Grid (O / block_o, E splits), as kernel.default_split picks it (from O and
E only). Each program writes float32 partial sums [split, O, M']; one XLA
epilogue adds the splits in a fixed chain, applies the scale (and SwiGLU,
residual), transposes and casts. Row invariance: every wgmma has the shape
[block_o, block_e] x [block_e, block_m] whatever M, a row's tile position is
fixed, and no tile or split depends on M.

interpret=True runs the kernel in Mosaic GPU's interpret mode on the CPU
(jax._src...InterpretGPUParams: not public as of jax 0.11).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import split_e as se
from pallas_kernels.mosaic_gpu import (SEMANTICS, interpret_params,
                                       reset_interpret_state)  # noqa: F401
from pallas_kernels.qmatmul.kernel import WEIGHT_DTYPES, default_split



def _swizzled(dtype, minor: int):
  """Tiling + swizzle transforms for a shared-memory tile read in slices of
  `minor` elements along its last dim. wgmma's two operands must share one
  swizzle: both bf16 operands take block_m's (32 B at block_m = 16)."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)),
          plgpu.SwizzleTransform(swizzle))


def _kernel(w_gmem, xt_gmem, out_gmem, wb_smem, out_smem, *, bo, be, bm,
            row_tiles, steps, depth):
  """One program: out[split, o block, :] = w[o block, E run] @ x^T[E run]."""
  o, sp = lax.axis_index("o"), lax.axis_index("split")
  mp = bm * row_tiles
  w_spec = plgpu.BlockSpec((bo, be), lambda k: (o, sp * steps + k),
                           transforms=_swizzled(w_gmem.dtype, be))
  x_spec = plgpu.BlockSpec((be, mp), lambda k: (sp * steps + k, 0),
                           transforms=_swizzled(jnp.bfloat16, bm))

  def with_accumulators(*accs):
    def step(_, w_smem, x_smem):
      w = w_smem[...]
      if w.dtype != jnp.int8:  # Mosaic's direct e4m3 -> bf16 needs PTX 9.2
        w = w.astype(jnp.float32)
      wb_smem[...] = w.astype(jnp.bfloat16)  # exact: 8-bit values fit bf16
      plgpu.commit_smem()
      for r, acc in enumerate(accs):
        plgpu.wgmma(acc, wb_smem, x_smem.at[:, pl.ds(r * bm, bm)])
      plgpu.wgmma_wait(0)  # wb_smem and the pipeline slots are reused

    plgpu.emit_pipeline(step, grid=(steps,), in_specs=[w_spec, x_spec],
                        max_concurrent_steps=depth)(w_gmem, xt_gmem)
    for r, acc in enumerate(accs):
      out_smem[:, pl.ds(r * bm, bm)] = acc[...]

  pl.run_scoped(with_accumulators,
                *[plgpu.ACC((bo, bm), jnp.float32)] * row_tiles)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[sp, pl.ds(o * bo, bo)])
  plgpu.wait_smem_to_gmem(0)


def _splits(o, e, bo, be, split_e):
  """E splits that divide E's blocks (the pipeline's grid is static)."""
  n_e = e // be
  if split_e is not None:
    if n_e % split_e:
      raise NotImplementedError(f"split_e={split_e} must divide E / block_e "
                                f"= {n_e}")
    return split_e
  splits = default_split(o, e, bo, be)
  while n_e % splits:
    splits -= 1
  return splits


def _depth(bo, be, mp):
  """Pipeline stages that fit the shared-memory budget beside the bf16
  weight tile and the output tile (2 at least, else NotImplementedError)."""
  fixed = bo * be * 2 + bo * mp * 4
  stages = (se.SHARED_MEMORY_BUDGET - fixed) // (bo * be + be * mp * 2)
  if stages < 2:
    raise NotImplementedError(f"{mp} rows leave under 2 pipeline stages in "
                              "shared memory (decode-sized M only)")
  return min(4, stages)


def _partials(xt_ExMp, w_OxE, *, bo, be, bm, splits, interpret):
  """float32 partial sums [splits, O, M'] of w @ x^T."""
  e, mp = xt_ExMp.shape
  o = w_OxE.shape[0]
  steps = e // be // splits
  kern = functools.partial(_kernel, bo=bo, be=be, bm=bm, row_tiles=mp // bm,
                           steps=steps, depth=_depth(bo, be, mp))
  return plgpu.kernel(
      kern, out_type=jax.ShapeDtypeStruct((splits, o, mp), jnp.float32),
      grid=(o // bo, splits), grid_names=("o", "split"),
      scratch_types=[
          plgpu.SMEM((bo, be), jnp.bfloat16,
                     transforms=_swizzled(jnp.bfloat16, bm)),
          plgpu.SMEM((bo, mp), jnp.float32,
                     transforms=_swizzled(jnp.float32, bm))],
      compiler_params=plgpu.CompilerParams(lowering_semantics=SEMANTICS),
      interpret=interpret_params() if interpret else None,
  )(w_OxE, xt_ExMp)


def _check(x_MxE, w_OxE, scale_OxZ, activations, bo, be, bm):
  """NotImplementedError for what this kernel does not take."""
  o, e = w_OxE.shape
  if activations != "bf16":
    raise NotImplementedError("W8A8 (fp8 rows): use the Triton kernel")
  if x_MxE.dtype != jnp.bfloat16:
    raise NotImplementedError(f"x dtype {x_MxE.dtype}: bfloat16 only")
  if w_OxE.dtype not in WEIGHT_DTYPES:
    raise NotImplementedError(f"weight dtype {w_OxE.dtype}")
  if scale_OxZ.shape[1] != 1:
    raise NotImplementedError("per-group scales: per-channel (Z = 1) only")
  if bo % 64 or be % 64 or bm % 16:
    raise NotImplementedError("block_o and block_e must be multiples of 64, "
                              "block_m of 16")
  if o % bo or e % be:
    raise NotImplementedError(f"O = {o} and E = {e} must be multiples of "
                              f"block_o = {bo} and block_e = {be}")


@functools.partial(jax.jit, static_argnames=(
    "activations", "block_o", "block_e", "block_m", "split_e", "interpret"))
def matmul(x_MxE, w_OxE, scale_OxZ, *, w_up_OxE=None, scale_up_OxZ=None,
           residual_MxO=None, activations: str = "bf16", block_o: int = 64,
           block_e: int = 128, block_m: int = 16, split_e: int | None = None,
           interpret: bool = False):
  """Same contract as reference.matmul (arguments checked by api.matmul).

  Takes bf16 rows, per-channel scales, optional SwiGLU (w_up_OxE) and
  residual; raises NotImplementedError for anything else, for O or E that
  are not multiples of block_o / block_e, and for more rows than two
  pipeline stages of shared memory hold (192 at the default tiles).
  """
  m, e = x_MxE.shape
  o = w_OxE.shape[0]
  bo, be, bm = block_o, block_e, block_m
  _check(x_MxE, w_OxE, scale_OxZ, activations, bo, be, bm)
  splits = _splits(o, e, bo, be, split_e)
  mp = pl.cdiv(m, bm) * bm
  xt_ExMp = jnp.pad(x_MxE.T, ((0, 0), (0, mp - m)))
  stream = functools.partial(_partials, xt_ExMp, bo=bo, be=be, bm=bm,
                             splits=splits, interpret=interpret)

  def product(w, s):
    """[M, O] float32: the splits added in one fixed chain, then scaled."""
    parts = stream(w)
    y_OxMp = functools.reduce(lambda a, b: a + b, list(parts))
    return (y_OxMp[:, :m] * s).T

  y_MxO = product(w_OxE, scale_OxZ)
  if w_up_OxE is not None:
    y_MxO = se.silu(y_MxO) * product(w_up_OxE, scale_up_OxZ)
  if residual_MxO is not None:
    y_MxO = y_MxO + residual_MxO.astype(jnp.float32)
  return y_MxO.astype(x_MxE.dtype)
