"""Pallas Mosaic GPU (Hopper) grouped GEMM: TMA-fed tiles and wgmma.

The same product as kernel.py (Triton), for bf16 rows and bf16 expert
stacks: rows sorted by expert and padded so that every tile of tile_m rows
is one expert's (tile_expert, -1 = empty). A program owns one [tile_m,
block_n] output tile (grid: column tiles, then row tiles), reads its
tile's expert from tile_expert and streams the row tile's [tile_m,
block_k] slices and its expert's [block_k, block_n] weight slices through
shared memory with TMA (plgpu.emit_pipeline over I / block_k steps, in
order), each step one wgmma per accumulator (two, gate and up, for the
fused SwiGLU: one read of the rows for both). The epilogue (SwiGLU, the
cast) runs in registers and the tile leaves by TMA. An empty tile runs no
step: its zero accumulators give zeros.

Row tiles: tile_m is 64 or 128 (rows_per_tile picks it per call from the
routed rows, more rows an expert on average taking 128: half the weight
reads); block_n is 64 for the fused SwiGLU, else 128 (default_block_n),
so that 128 rows' float32 accumulators fit one warpgroup's registers.

Row invariance: whatever tile_m, Mosaic issues one m64 wgmma per 64-row
slice of a tile per 16 inputs, each [64, 16] x [16, block_n], in the same
order of blocks; block_n and block_k depend on I, O and the options,
never on P or the group sizes. So a row's output bits depend on its row
and its expert's weights alone.

8-bit stacks, float32 rows, widths that are not multiples of the blocks:
NotImplementedError (api.py then runs the Triton kernel).
interpret=True runs the kernel in Mosaic GPU's interpret mode on the CPU.
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

ROW_TILES = (64, 128)       # tile_m: one or two wgmma M slices of 64
ACC_ELEMENTS = 128 * 128    # float32 accumulator elements per program
BLOCK_K = 64                # inputs a step: one 128-byte swizzled bf16 row
WIDE_ROWS = 128             # mean routed rows an expert from which tm = 128


def rows_per_tile(n_pairs: int, n_experts: int) -> int:
  """tile_m for n_pairs routed rows over n_experts experts (static shapes):
  128 when an expert averages WIDE_ROWS rows or more, else 64. Any choice
  gives a row the same bits (module docstring)."""
  return 128 if n_pairs >= WIDE_ROWS * n_experts else 64


def _swizzled(minor: int):
  """Tiling + swizzle transforms of a bf16 shared-memory tile whose last
  dim has `minor` elements (wgmma operands and TMA tiles)."""
  swizzle = plgpu.find_swizzle(minor * 16)
  return (plgpu.TilingTransform((8, swizzle // 2)),
          plgpu.SwizzleTransform(swizzle))


def _kernel(te_gmem, x_gmem, *refs, tm, bn, bk, steps, depth, swiglu):
  """One [tm, bn] output tile (module docstring)."""
  w_gmems, o_gmem, o_smem = refs[:1 + swiglu], refs[1 + swiglu], refs[-1]
  j, i = lax.axis_index("n"), lax.axis_index("m")
  ex = te_gmem[i]

  def with_accumulators(*accs):
    @pl.when(ex >= 0)
    def _stream():
      def step(_, x_smem, *w_smems):
        for acc, w_smem in zip(accs, w_smems):
          plgpu.wgmma(acc, x_smem, w_smem)
        plgpu.wgmma_wait(0)  # the pipeline's slots are reused

      x_spec = plgpu.BlockSpec((tm, bk), lambda k: (i, k),
                               transforms=_swizzled(bk))
      w_spec = plgpu.BlockSpec((bk, bn), lambda k: (k, j),
                               transforms=_swizzled(bn))
      plgpu.emit_pipeline(
          step, grid=(steps,), in_specs=[x_spec] + [w_spec] * len(accs),
          max_concurrent_steps=depth)(x_gmem, *[w.at[ex] for w in w_gmems])

    ys = [acc[...] for acc in accs]
    y = se.silu(ys[0]) * ys[1] if swiglu else ys[0]
    o_smem[...] = y.astype(o_smem.dtype)

  pl.run_scoped(with_accumulators,
                *[plgpu.ACC((tm, bn), jnp.float32)] * (1 + swiglu))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(i * tm, tm),
                                            pl.ds(j * bn, bn)])
  plgpu.wait_smem_to_gmem(0)


def _depth(tm, bn, bk, n_weights):
  """Pipeline stages that fit the shared-memory budget beside the output
  tile (2 at least, else NotImplementedError; 4 at most)."""
  stage = (tm * bk + n_weights * bk * bn) * 2
  stages = (se.SHARED_MEMORY_BUDGET - tm * bn * 2) // stage
  if stages < 2:
    raise NotImplementedError(f"tile {tm}x{bn} leaves under 2 pipeline "
                              "stages in shared memory")
  return min(4, stages)


def default_block_n(o: int, swiglu: bool) -> int:
  """block_n from O and the options alone: 64 for the fused SwiGLU (two
  accumulators of up to 128 rows), else 128 where it divides O, else 64."""
  return 128 if not swiglu and o % 128 == 0 else 64


def check(x_PxI, weight, up=None, *, tile_m: int, block_n=None,
          block_k: int = BLOCK_K) -> tuple[int, int]:
  """(block_n, block_k) for these shapes; NotImplementedError for what the
  kernel does not take (api.py runs Triton then). Depends on the widths,
  dtypes and options only: the same answer for any P."""
  i = x_PxI.shape[1]
  if len(weight) != 1:
    raise NotImplementedError("8-bit expert stacks: the Triton kernel")
  if x_PxI.dtype != jnp.bfloat16 or weight[0].dtype != jnp.bfloat16:
    raise NotImplementedError(f"rows {x_PxI.dtype} and weights "
                              f"{weight[0].dtype}: bfloat16 only")
  if up is not None and (len(up) != 1 or up[0].dtype != jnp.bfloat16):
    raise NotImplementedError("the up stack must be bfloat16 as well")
  if tile_m not in ROW_TILES:
    raise NotImplementedError(f"tile_m {tile_m}: one of {ROW_TILES}")
  o = weight[0].shape[2]
  swiglu = up is not None
  bn = default_block_n(o, swiglu) if block_n is None else block_n
  if bn % 64 or block_k % 64 or bn * tile_m * (1 + swiglu) > ACC_ELEMENTS:
    raise NotImplementedError(
        f"block_n {bn} and block_k {block_k} must be multiples of 64 with "
        f"tile_m x block_n accumulators of at most {ACC_ELEMENTS} elements")
  if o % bn or i % block_k:
    raise NotImplementedError(f"O = {o} and I = {i} must be multiples of "
                              f"block_n = {bn} and block_k = {block_k}")
  return bn, block_k


@functools.partial(jax.jit, static_argnames=(
    "tile_m", "block_n", "block_k", "interpret"))
def grouped_matmul(x_PxI, tile_expert, weight, *, up=None, tile_m: int = 64,
                   block_n: int | None = None, block_k: int = BLOCK_K,
                   interpret: bool = False):
  """Same contract as reference.grouped_matmul for bf16 rows and stacks
  (kernel [X, I, O],); NotImplementedError for the rest (check), for P not
  a multiple of tile_m and for arrays of 2^31 elements or more."""
  p, i = x_PxI.shape
  bn, bk = check(x_PxI, weight, up, tile_m=tile_m, block_n=block_n,
                 block_k=block_k)
  o = weight[0].shape[2]
  if p % tile_m:
    raise NotImplementedError(f"P = {p} is not a multiple of tile_m = "
                              f"{tile_m}")
  stacks = [weight[0]] + ([up[0]] if up is not None else [])
  if max(p * o, p * i, *(w.size for w in stacks)) >= 2 ** 31:
    raise NotImplementedError("arrays of 2^31 elements or more")
  swiglu = up is not None
  kern = functools.partial(
      _kernel, tm=tile_m, bn=bn, bk=bk, steps=i // bk,
      depth=_depth(tile_m, bn, bk, len(stacks)), swiglu=swiglu)
  return plgpu.kernel(
      kern, out_type=jax.ShapeDtypeStruct((p, o), x_PxI.dtype),
      grid=(o // bn, p // tile_m), grid_names=("n", "m"),
      scratch_types=[plgpu.SMEM((tile_m, bn), x_PxI.dtype,
                                transforms=_swizzled(bn))],
      compiler_params=plgpu.CompilerParams(lowering_semantics=SEMANTICS),
      interpret=interpret_params() if interpret else None,
  )(tile_expert.astype(jnp.int32), x_PxI, *stacks)
