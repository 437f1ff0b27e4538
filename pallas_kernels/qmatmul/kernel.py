"""Pallas (Triton) weight-streaming matmul with 8-bit weights.

Few rows (decode) make a projection a read of W, so 1-byte weights halve it.
The kernel streams w_OxE tiles ([block_n, block_e], contiguous along E) and
converts them in registers: to x's dtype (weight-only), or kept e4m3 against
e4m3 rows (W8A8: an e4m3 x e4m3 dot with float32 accumulation; int8 weights
then meet the rows in bf16, exactly). Triton (3.9, sm_90) puts that dot on
fp8 tensor cores only for tiles of >= 64 rows with maxNumImpreciseAcc set,
which Pallas does not set; otherwise it runs f16 MMAs of exactly upcast
operands, which costs nothing where the kernel is meant to run (few rows,
bound by the weight read). Per-channel scales (and the row scales) multiply
the float32 sum once; per-group scales (block_e = the group) multiply each
tile's product, which keeps the weights exact.

Grid (row tile, column tile, E split), row tiles fastest as in
pallas_kernels/matmul. Row invariance: every tile size and the E split
depend on E, O and the options only, never on M, and split partial sums are
added in one fixed chain, so a row's bits do not depend on the other rows.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import split_e as se
from pallas_kernels.common import is_pow2
from pallas_kernels.qmatmul.reference import FP8, quantize_rows

WEIGHT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(FP8))


def _zero(dtype):
  return 0 if jnp.issubdtype(dtype, jnp.integer) else 0.0


def _kernel(*refs, m, o, e, bm, bn, be, splits, grouped, fp8_x, compute,
            swiglu, residual, final):
  it = iter(refs)
  x_ref = next(it)
  sx_ref = next(it) if fp8_x else None
  pairs = [(next(it), next(it)) for _ in range(1 + swiglu)]  # (w, scale)
  res_ref = next(it) if residual else None
  out_refs = list(it)
  i, j, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  rows, cols = pl.ds(i * bm, bm), pl.ds(j * bn, bn)
  # float32 rows: an IEEE dot (Triton's default for float32 is TF32).
  precision = lax.Precision.HIGHEST if compute == jnp.float32 else None
  row_ok = i * bm + jnp.arange(bm) < m
  col_ok = j * bn + jnp.arange(bn) < o
  e0, e1 = se.block_range(e, be, splits, sp)

  def body(t, accs):
    ek = pl.ds(t * be, be)
    e_ok = t * be + jnp.arange(be) < e
    x = plgpu.load(x_ref.at[rows, ek], mask=row_ok[:, None] & e_ok[None, :],
                   other=_zero(x_ref.dtype)).astype(compute)
    w_mask = col_ok[:, None] & e_ok[None, :]
    out = []
    for acc, (w_ref, s_ref) in zip(accs, pairs):
      w = plgpu.load(w_ref.at[cols, ek], mask=w_mask,
                     other=_zero(w_ref.dtype)).astype(compute)
      d = lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32,
                          precision=precision)
      if grouped:
        d = d * plgpu.load(s_ref.at[cols, t], mask=col_ok, other=0.0)[None, :]
      out.append(acc + d)
    return tuple(out)

  zeros = jnp.zeros((bm, bn), jnp.float32)
  accs = lax.fori_loop(e0, e1, body, (zeros,) * (1 + swiglu))
  if not grouped:  # (a Python 0 index does not discharge in interpret mode)
    accs = tuple(acc * plgpu.load(s_ref.at[cols, jnp.int32(0)], mask=col_ok,
                                  other=0.0)[None, :]
                 for acc, (_, s_ref) in zip(accs, pairs))
  if fp8_x:
    sx = plgpu.load(sx_ref.at[rows], mask=row_ok, other=0.0)
    accs = tuple(acc * sx[:, None] for acc in accs)
  se.store_tile(accs, out_refs, res_ref, rows, cols,
                row_ok[:, None] & col_ok[None, :], swiglu=swiglu, final=final)


def default_split(o, e, block_n, block_e, target=264):
  """Splits of E so that about `target` programs (2 per H200 SM) run per row
  tile: from O and E only, so the split never depends on M."""
  programs = pl.cdiv(o, block_n)
  return max(1, min(pl.cdiv(target, programs), pl.cdiv(e, block_e) // 4))


def _compute_dtype(x_dtype, w_dtype, fp8_x):
  """The dtype both dot operands are converted to in registers."""
  if fp8_x:
    return jnp.dtype(FP8) if w_dtype == FP8 else jnp.dtype(jnp.bfloat16)
  if x_dtype not in (jnp.bfloat16, jnp.float32):
    raise NotImplementedError(f"x dtype {x_dtype}: bfloat16 or float32")
  return jnp.dtype(x_dtype)


@functools.partial(jax.jit, static_argnames=(
    "activations", "block_m", "block_n", "block_e", "split_e", "num_warps",
    "num_stages", "interpret"))
def matmul(x_MxE, w_OxE, scale_OxZ, *, w_up_OxE=None, scale_up_OxZ=None,
           residual_MxO=None, activations: str = "bf16", block_m: int = 16,
           block_n: int = 64, block_e: int = 128, split_e: int | None = None,
           num_warps: int = 4, num_stages: int | None = None,
           interpret: bool = False):
  """Same contract as reference.matmul (arguments checked by api.matmul).

  No tile depends on M. split_e None picks default_split; num_stages None
  the deepest pipeline (<= 4) whose tiles fit in ~180 KiB of shared memory.
  Raises NotImplementedError for tiles that are not powers of two >= 16
  (>= 32 along E for an fp8 x fp8 dot), per-group scales whose group is not
  block_e, or weight-only x that is not bfloat16 or float32.
  """
  m, e = x_MxE.shape
  o, z = scale_OxZ.shape
  fp8_x, swiglu = activations == "fp8", w_up_OxE is not None
  residual = residual_MxO is not None
  compute = _compute_dtype(x_MxE.dtype, w_OxE.dtype, fp8_x)
  if not all(is_pow2(t) and t >= 16 for t in (block_m, block_n, block_e)):
    raise NotImplementedError("tiles must be powers of two >= 16")
  if compute == FP8 and block_e < 32:
    raise NotImplementedError("an fp8 x fp8 dot needs block_e >= 32")
  grouped = z > 1
  if grouped and e // z != block_e:
    raise NotImplementedError(f"groups of {e // z} need block_e={e // z}")
  splits = split_e or default_split(o, e, block_n, block_e)
  x_bytes = 1 if fp8_x else x_MxE.dtype.itemsize
  if num_stages is None:
    per_stage = block_m * block_e * x_bytes + block_e * block_n * (1 + swiglu)
    num_stages = se.pipeline_depth(per_stage)
  final = splits == 1
  args = [*quantize_rows(x_MxE)] if fp8_x else [x_MxE]
  args += [w_OxE, scale_OxZ.astype(jnp.float32)]
  if swiglu:
    args += [w_up_OxE, scale_up_OxZ.astype(jnp.float32)]
  if residual and final:
    args.append(residual_MxO)
  kernel = functools.partial(
      _kernel, m=m, o=o, e=e, bm=block_m, bn=block_n, be=block_e,
      splits=splits, grouped=grouped, fp8_x=fp8_x, compute=compute,
      swiglu=swiglu, residual=residual and final, final=final)
  outs = se.launch(
      kernel, args, (pl.cdiv(m, block_m), pl.cdiv(o, block_n), splits),
      se.outputs(m, o, splits, 1 + swiglu, x_MxE.dtype),
      name="stream_qmatmul", interpret=interpret, num_warps=num_warps,
      num_stages=num_stages)
  if final:
    return outs[0]
  # One fixed chain of elementwise adds (an XLA reduce may reorder by shape).
  y, *up = [functools.reduce(lambda a, b: a + b, list(p)) for p in outs]
  if swiglu:
    y = se.silu(y) * up[0]
  if residual:
    y = y + residual_MxO.astype(jnp.float32)
  return y.astype(x_MxE.dtype)
