"""Pallas Mosaic GPU (Hopper) grouped GEMM: TMA-fed tiles and wgmma.

The same product as kernel.py (Triton), for bf16 rows: rows sorted by
expert and padded so that every tile of tile_m rows is one expert's
(tile_expert, -1 = empty). A program owns one [tile_m, block_n] output
tile (grid: column tiles, then row tiles), reads its tile's expert from
tile_expert and streams the row tile's [tile_m, block_k] slices and its
expert's weight slices through shared memory with TMA
(plgpu.emit_pipeline over I / block_k steps, in order), each step one
wgmma per accumulator (two, gate and up, for the fused SwiGLU: one read of
the rows for both). The epilogue (per-channel scales, SwiGLU, the cast)
runs in registers and the tile leaves by TMA. An empty tile runs no step:
its zero accumulators give zeros.

Stacks: bf16 kernel [X, I, O] tiles [block_k, block_n] go to wgmma as
they land; 8-bit kernel_q [X, O, I] (int8 or e4m3, one scale per output
channel) tiles [block_n, block_k] are converted to bf16 (exact) into a
swizzled shared-memory tile that wgmma reads transposed, and the scale
multiplies the float32 sum once.

Row tiles: tile_m is 64 or 128 (rows_per_tile picks it per call from the
routed rows, more rows an expert on average taking 128: half the weight
reads); block_n is 64 for the fused SwiGLU, else 128 (default_block_n),
so that 128 rows' float32 accumulators fit one warpgroup's registers.

Row invariance: whatever tile_m, Mosaic issues one m64 wgmma per 64-row
slice of a tile per 16 inputs, each [64, 16] x [16, block_n], in the same
order of blocks; block_n and block_k depend on I, O and the options,
never on P or the group sizes. So a row's output bits depend on its row
and its expert's weights alone.

Float32 rows, per-group scales, widths that are not multiples of the
blocks: NotImplementedError (api.py then runs the Triton kernel).
interpret=True runs the kernel in Mosaic GPU's interpret mode on the CPU,
which takes no transposed wgmma operand: there the converted 8-bit tile is
transposed in registers instead (the same products).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import split_e as se
from pallas_kernels.grouped_matmul.kernel import WEIGHT_DTYPES
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


def _swizzled(minor: int, dtype=jnp.bfloat16):
  """Tiling + swizzle transforms of a shared-memory tile whose last dim has
  `minor` elements of dtype (wgmma operands and TMA tiles)."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor * bits)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)),
          plgpu.SwizzleTransform(swizzle))


def _kernel(te_gmem, x_gmem, *refs, tm, bn, bk, steps, depth, swiglu,
            quantized, overlap, interpret):
  """One [tm, bn] output tile (module docstring). 8-bit: refs hold each
  stack's (kernel_q [X, O, I], scale [X, O]), and the scratch its
  converted bf16 tile [bn, bk] (two with overlap), its scale slice [bn]
  and a barrier."""
  n = 1 + swiglu
  per = 2 if quantized else 1
  stacks = [refs[w * per:(w + 1) * per] for w in range(n)]
  o_gmem, o_smem = refs[n * per], refs[n * per + 1]
  wb_smems, s_smems, bar = refs[n * per + 2:n * per + 2 + n], refs[
      n * per + 2 + n:n * per + 2 + 2 * n], refs[-1]
  j, i = lax.axis_index("n"), lax.axis_index("m")
  ex = te_gmem[i]
  if quantized:  # an empty tile's zeros times finite scales stay zeros
    for (_, s_gmem), s_smem in zip(stacks, s_smems):
      plgpu.copy_gmem_to_smem(
          s_gmem.at[jnp.maximum(ex, 0), pl.ds(j * bn, bn)], s_smem, bar.at[0])
    plgpu.barrier_wait(bar.at[0])

  def with_accumulators(*accs):
    @pl.when(ex >= 0)
    def _stream():
      def step(idx, x_smem, *w_smems):
        for w, (acc, w_smem) in enumerate(zip(accs, w_smems)):
          if not quantized:
            plgpu.wgmma(acc, x_smem, w_smem)
            continue
          q = w_smem[...]
          if q.dtype != jnp.int8:  # Mosaic's direct e4m3 -> bf16: PTX 9.2
            q = q.astype(jnp.float32)
          q = q.astype(jnp.bfloat16)  # exact
          # Interpret mode runs no transposed operand: it transposes the
          # values (its tile is [bk, bn]), the GPU the wgmma's view.
          wb = wb_smems[w].at[lax.rem(idx[0], 2)] if overlap else wb_smems[w]
          wb[...] = q.T if interpret else q
          plgpu.commit_smem()
          plgpu.wgmma(acc, x_smem, wb if interpret else wb.transpose((1, 0)))
        # The slots (and converted tiles) are reused: this step's products
        # may run on (overlap) while the pipeline holds its slots a step
        # longer, the previous step's must be done.
        plgpu.wgmma_wait(n if overlap else 0)

      hold = dict(delay_release=1) if overlap else {}
      x_spec = plgpu.BlockSpec((tm, bk), lambda k: (i, k),
                               transforms=_swizzled(bk), **hold)
      if quantized:
        w_spec = plgpu.BlockSpec((bn, bk), lambda k: (j, k), **hold,
                                 transforms=_swizzled(bk, stacks[0][0].dtype))
      else:
        w_spec = plgpu.BlockSpec((bk, bn), lambda k: (k, j), **hold,
                                 transforms=_swizzled(bn))
      plgpu.emit_pipeline(
          step, grid=(steps,), in_specs=[x_spec] + [w_spec] * n,
          max_concurrent_steps=depth)(x_gmem, *[w[0].at[ex] for w in stacks])

    ys = [acc[...] for acc in accs]
    if quantized:
      cast = (lambda v: v) if interpret else (
          lambda v: plgpu.layout_cast(v, plgpu.Layout.WGMMA.reduce(0)))
      ys = [y * lax.broadcast_in_dim(cast(s_smem[...]), y.shape, [1])
            for y, s_smem in zip(ys, s_smems)]
    y = se.silu(ys[0]) * ys[1] if swiglu else ys[0]
    o_smem[...] = y.astype(o_smem.dtype)

  pl.run_scoped(with_accumulators,
                *[plgpu.ACC((tm, bn), jnp.float32)] * n)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(i * tm, tm),
                                            pl.ds(j * bn, bn)])
  plgpu.wait_smem_to_gmem(0)


def _depth(tm, bn, bk, n_weights, quantized, overlap):
  """Pipeline stages that fit the shared-memory budget beside the output
  tile and the converted 8-bit tiles (2 at least, else
  NotImplementedError; 4 at most)."""
  stage = tm * bk * 2 + n_weights * bk * bn * (1 if quantized else 2)
  fixed = tm * bn * 2 + (n_weights * bn * (bk * 2 * (1 + overlap) + 4)
                         if quantized else 0)
  stages = (se.SHARED_MEMORY_BUDGET - fixed) // stage
  if stages < 2:
    raise NotImplementedError(f"tile {tm}x{bn} leaves under 2 pipeline "
                              "stages in shared memory")
  return min(4, stages)


def default_block_n(o: int, swiglu: bool) -> int:
  """block_n from O and the options alone: 64 for the fused SwiGLU (two
  accumulators of up to 128 rows), else 128 where it divides O, else 64."""
  return 128 if not swiglu and o % 128 == 0 else 64


def _widths(weight) -> tuple[int, int]:
  """(I, O) of a stack: (kernel [X, I, O],) or (kernel_q [X, O, I], s)."""
  w = weight[0]
  return (w.shape[1], w.shape[2]) if len(weight) == 1 else (w.shape[2],
                                                             w.shape[1])


def _check_stack(weight, name):
  if len(weight) == 1:
    if weight[0].dtype != jnp.bfloat16:
      raise NotImplementedError(f"{name} stack {weight[0].dtype}: bfloat16 "
                                "or 8-bit")
  elif weight[0].dtype not in WEIGHT_DTYPES:
    raise NotImplementedError(f"8-bit {name} stack of {weight[0].dtype}")
  elif weight[1].shape[-1] != 1:
    raise NotImplementedError("per-group scales: per-channel only")


def check(x_PxI, weight, up=None, *, tile_m: int, block_n=None,
          block_k: int = BLOCK_K) -> tuple[int, int]:
  """(block_n, block_k) for these shapes; NotImplementedError for what the
  kernel does not take (api.py runs Triton then). Depends on the widths,
  dtypes and options only: the same answer for any P."""
  if x_PxI.dtype != jnp.bfloat16:
    raise NotImplementedError(f"rows {x_PxI.dtype}: bfloat16 only")
  _check_stack(weight, "weight")
  if up is not None:
    _check_stack(up, "up")
    if len(up) != len(weight) or up[0].dtype != weight[0].dtype:
      raise NotImplementedError("up and weight stacks of two formats")
  if tile_m not in ROW_TILES:
    raise NotImplementedError(f"tile_m {tile_m}: one of {ROW_TILES}")
  i, o = _widths(weight)
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
    "tile_m", "block_n", "block_k", "overlap", "interpret"))
def grouped_matmul(x_PxI, tile_expert, weight, *, up=None, tile_m: int = 64,
                   block_n: int | None = None, block_k: int = BLOCK_K,
                   overlap: bool = False, interpret: bool = False):
  """Same contract as reference.grouped_matmul for bf16 rows, bf16 or
  8-bit (per-channel) stacks; NotImplementedError for the rest (check),
  for P not a multiple of tile_m, arrays of 2^31 elements or more and
  more than 65535 row tiles. overlap: a step's wgmmas run on into the
  next step (its slots released a step later), not waited for at the
  step's end; the same products in the same order."""
  p, i = x_PxI.shape
  bn, bk = check(x_PxI, weight, up, tile_m=tile_m, block_n=block_n,
                 block_k=block_k)
  o = _widths(weight)[1]
  if p % tile_m:
    raise NotImplementedError(f"P = {p} is not a multiple of tile_m = "
                              f"{tile_m}")
  stacks = [weight] + ([up] if up is not None else [])
  if max(p * o, p * i, *(w[0].size for w in stacks)) >= 2 ** 31:
    raise NotImplementedError("arrays of 2^31 elements or more")
  if p // tile_m >= 2 ** 16:  # the grid's second dimension
    raise NotImplementedError(f"{p // tile_m} row tiles: 65535 at most")
  quantized, n = len(weight) == 2, len(stacks)
  args, scratch = [], [plgpu.SMEM((tile_m, bn), x_PxI.dtype,
                                  transforms=_swizzled(bn))]
  for w in stacks:
    args += [w[0], w[1][..., 0].astype(jnp.float32)] if quantized else [w[0]]
  if quantized:
    wb = (bk, bn) if interpret else (bn, bk)  # (_kernel)
    scratch += [plgpu.SMEM((2,) * overlap + wb, jnp.bfloat16,
                           transforms=_swizzled(wb[1]))] * n
    scratch += [plgpu.SMEM((bn,), jnp.float32)] * n
    scratch += [plgpu.Barrier(num_arrivals=n, num_barriers=1)]
  kern = functools.partial(
      _kernel, tm=tile_m, bn=bn, bk=bk, steps=i // bk,
      depth=_depth(tile_m, bn, bk, n, quantized, overlap),
      swiglu=up is not None, quantized=quantized, overlap=overlap,
      interpret=interpret)
  return plgpu.kernel(
      kern, out_type=jax.ShapeDtypeStruct((p, o), x_PxI.dtype),
      grid=(o // bn, p // tile_m), grid_names=("n", "m"),
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(lowering_semantics=SEMANTICS),
      interpret=interpret_params() if interpret else None,
  )(tile_expert.astype(jnp.int32), x_PxI, *args)
