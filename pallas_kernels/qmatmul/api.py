"""Public entry: matmul with 8-bit weights, by kernel, XLA or reference.

implementation:
  'reference'         reference.matmul (float32 throughout).
  'xla'               XLA's dot: W8A8 with e4m3 weights as lax.dot_general
                      of two e4m3 operands contracting both dims 1 (the
                      layout that makes XLA call cuBLASLt's fp8 GEMM on
                      Hopper), times row and column scales; weight-only (and
                      int8 weights under fp8 rows) as the weight converted to
                      the rows' dtype inside the jit and a dot in that dtype
                      with float32 accumulation; per-group scales dequantize
                      the weight to float32, and it runs as two bf16 dots
                      (its top 16 bits and the rest), so the scaled weight
                      is not rounded to bf16. The fp8 GEMM runs without fast
                      accumulation (reduced-precision sums).
  'pallas' / 'pallas_interpret'
                      the weight-streaming kernel (kernel.py), which reads
                      1-byte weights and dequantizes in registers; what it
                      does not take (kernel.matmul's NotImplementedError)
                      falls through to 'xla'. Its rows are invariant to M.
  'mosaic' / 'mosaic_interpret'
                      the Mosaic GPU (Hopper: TMA pipeline, wgmma) kernel
                      (mosaic.py) for bf16 rows and per-channel scales, run
                      in Mosaic GPU's interpret mode by 'mosaic_interpret';
                      what it does not take falls through to 'pallas' /
                      'pallas_interpret' (with their default tiles), then
                      'xla'. Its rows are invariant to M. Not the default:
                      no measured table has it win yet.
  None                'pallas' on a GPU, 'reference' elsewhere.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import common
from pallas_kernels.qmatmul import kernel, reference
from pallas_kernels.qmatmul.reference import FP8

IMPLEMENTATIONS = ("pallas", "pallas_interpret", "mosaic",
                   "mosaic_interpret", "xla", "reference")
ACTIVATIONS = ("bf16", "fp8")


def resolve_implementation(implementation: str | None) -> str:
  """common.resolve_implementation with 'xla' allowed."""
  return common.resolve_implementation(implementation, IMPLEMENTATIONS)


def _check_weight(name, w, s, e):
  """w [O, E] int8 / e4m3 with float32 scales [O, Z], Z dividing E."""
  if w.ndim != 2 or w.shape[1] != e:
    raise ValueError(f"{name} must be [O, E] with E = {e} (x's width), got "
                     f"shape {w.shape}")
  if w.dtype not in kernel.WEIGHT_DTYPES:
    raise ValueError(f"{name} dtype must be int8 or float8_e4m3fn, got "
                     f"{w.dtype}")
  sname = "scale_OxZ" if name == "w_OxE" else "scale_up_OxZ"
  if s is None:
    raise ValueError(f"{name} needs {sname}")
  if s.ndim != 2 or s.shape[0] != w.shape[0] or s.shape[1] < 1:
    raise ValueError(f"{sname} must be [O, Z] with O = {w.shape[0]}, got "
                     f"shape {s.shape}")
  if e % s.shape[1]:
    raise ValueError(f"{sname} has Z = {s.shape[1]} groups, which do not "
                     f"divide E = {e}")
  if s.dtype != jnp.float32:
    raise ValueError(f"{sname} dtype must be float32, got {s.dtype}")


def check_args(x_MxE, w_OxE, scale_OxZ, w_up_OxE=None, scale_up_OxZ=None,
               residual_MxO=None, activations="bf16"):
  """Raises ValueError naming the first argument that breaks the contract."""
  if activations not in ACTIVATIONS:
    raise ValueError(f"activations must be one of {ACTIVATIONS}, got "
                     f"{activations!r}")
  if x_MxE.ndim != 2 or not jnp.issubdtype(x_MxE.dtype, jnp.floating):
    raise ValueError(f"x_MxE must be a 2-D float array, got shape "
                     f"{x_MxE.shape} dtype {x_MxE.dtype}")
  m, e = x_MxE.shape
  _check_weight("w_OxE", w_OxE, scale_OxZ, e)
  if (w_up_OxE is None) != (scale_up_OxZ is None):
    raise ValueError("w_up_OxE and scale_up_OxZ come together")
  if w_up_OxE is not None:
    _check_weight("w_up_OxE", w_up_OxE, scale_up_OxZ, e)
    if (w_up_OxE.shape, w_up_OxE.dtype, scale_up_OxZ.shape) != (
        w_OxE.shape, w_OxE.dtype, scale_OxZ.shape):
      raise ValueError(
          f"w_up_OxE {w_up_OxE.shape} {w_up_OxE.dtype} / scale_up_OxZ "
          f"{scale_up_OxZ.shape} must match w_OxE {w_OxE.shape} "
          f"{w_OxE.dtype} / scale_OxZ {scale_OxZ.shape}")
  want = (m, w_OxE.shape[0])
  if residual_MxO is not None and residual_MxO.shape != want:
    raise ValueError(f"residual_MxO must have shape {want}, got "
                     f"{residual_MxO.shape}")


def _fp8_algorithm():
  """cuBLASLt's fp8 GEMM without fast accumulation on a GPU (its default
  accumulates in reduced precision); the CPU takes no algorithm."""
  if jax.default_backend() in ("cuda", "gpu", "rocm"):
    return jax.lax.DotAlgorithmPreset.ANY_F8_ANY_F8_F32
  return jax.lax.Precision.DEFAULT


def _split_bf16(w):
  """(hi, lo) in bfloat16 with hi + lo = w (float32) to ~16 significant
  bits. hi keeps w's top 16 bits by a mask: a bf16 round trip would do, but
  XLA:GPU (excess precision allowed) drops it, and lo becomes 0."""
  bits = jax.lax.bitcast_convert_type(w, jnp.uint32) & jnp.uint32(0xFFFF0000)
  hi = jax.lax.bitcast_convert_type(bits, jnp.float32)
  return hi.astype(jnp.bfloat16), (w - hi).astype(jnp.bfloat16)


def _xla_product(x_MxE, w_OxE, scale_OxZ, activations):
  """float32 x @ W^T through XLA's dot (see the module docstring)."""
  dot = lambda a, b, precision=None: jax.lax.dot_general(
      a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
      precision=precision)
  per_channel = scale_OxZ.shape[1] == 1
  if activations == "fp8":
    xq_MxE, sx_M = reference.quantize_rows(x_MxE)
    # One row is a matrix-vector product, which takes no fp8 algorithm.
    if per_channel and w_OxE.dtype == FP8 and x_MxE.shape[0] > 1:
      return dot(xq_MxE, w_OxE, _fp8_algorithm()) * (
          sx_M[:, None] * scale_OxZ[:, 0])
    x_MxE, row_M = xq_MxE.astype(jnp.bfloat16), sx_M[:, None]
  else:
    row_M = 1.0
  if per_channel:
    # 8-bit values are exact in x's dtype: the scale applies to the sum.
    return dot(x_MxE, w_OxE.astype(x_MxE.dtype)) * row_M * scale_OxZ[:, 0]
  w = reference.dequantize(w_OxE, scale_OxZ)
  if x_MxE.dtype != jnp.bfloat16:
    return dot(x_MxE, w.astype(x_MxE.dtype)) * row_M
  # Group scales do not factor out of the sum, and one bf16 copy of the
  # scaled weight would round it: x @ hi + x @ lo.
  hi, lo = _split_bf16(w)
  return (dot(x_MxE, hi) + dot(x_MxE, lo)) * row_M


@functools.partial(jax.jit, static_argnames=("activations",))
def _xla(x_MxE, w_OxE, scale_OxZ, w_up_OxE, scale_up_OxZ, residual_MxO,
         activations):
  return reference.epilogue(
      lambda w, s: _xla_product(x_MxE, w, s, activations), w_OxE, scale_OxZ,
      w_up_OxE, scale_up_OxZ, residual_MxO, x_MxE.dtype)


def matmul(x_MxE: jax.Array, w_OxE: jax.Array, scale_OxZ: jax.Array, *,
           w_up_OxE=None, scale_up_OxZ=None, residual_MxO=None,
           activations: str = "bf16", implementation: str | None = None,
           **tiling) -> jax.Array:
  """Same contract as reference.matmul; the arguments are checked first.

  tiling (kernel only): block_m, block_n, block_e, split_e, num_warps,
  num_stages for 'pallas'; block_o, block_e, block_m, split_e for 'mosaic'.
  """
  impl = resolve_implementation(implementation)
  check_args(x_MxE, w_OxE, scale_OxZ, w_up_OxE, scale_up_OxZ, residual_MxO,
             activations)
  kw = dict(w_up_OxE=w_up_OxE, scale_up_OxZ=scale_up_OxZ,
            residual_MxO=residual_MxO, activations=activations)
  if impl == "reference":
    return reference.matmul(x_MxE, w_OxE, scale_OxZ, **kw)
  if impl in ("mosaic", "mosaic_interpret"):
    # Imported here: Mosaic GPU's Python modules cost ~0.3 s to import.
    from pallas_kernels.qmatmul import mosaic
    interpret = impl == "mosaic_interpret"
    try:
      return mosaic.matmul(x_MxE, w_OxE, scale_OxZ, **kw, **tiling,
                           interpret=interpret)
    except NotImplementedError:
      pass
    impl, tiling = ("pallas_interpret" if interpret else "pallas"), {}
  if impl != "xla":
    try:
      return kernel.matmul(x_MxE, w_OxE, scale_OxZ, **kw, **tiling,
                           interpret=impl == "pallas_interpret")
    except NotImplementedError:
      pass
  return _xla(x_MxE, w_OxE, scale_OxZ, w_up_OxE, scale_up_OxZ, residual_MxO,
              activations)
