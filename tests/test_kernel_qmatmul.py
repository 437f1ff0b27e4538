"""Matmul with 8-bit weights (pallas_kernels/qmatmul): the weight-streaming
kernel (interpret mode on the CPU, Triton on a GPU) and XLA's dots against
the plain-JAX reference, the kernel's row invariance, argument checks.

Formats: int8 per channel, int8 per group of 128, e4m3 weight-only, e4m3
W8A8, and with groups of 128 under e4m3 rows int8 and e4m3 weights.
GPU-marked tests run with JAX_PLATFORMS=cuda.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.qmatmul import api, kernel, reference
from pallas_kernels.qmatmul.reference import FP8
from tests.kernel_case import (assert_close, compiled, f32, gpu, gpu_only,
                               normal, rng)

# name: (weight dtype, group, activations)
FORMATS = {
    "int8": (jnp.int8, None, "bf16"),
    "int8_g128": (jnp.int8, 128, "bf16"),
    "fp8": (FP8, None, "bf16"),
    "fp8_w8a8": (FP8, None, "fp8"),
    "int8_w8a8_g128": (jnp.int8, 128, "fp8"),
    "fp8_w8a8_g128": (FP8, 128, "fp8"),
}
EPILOGUES = {"plain": (False, False), "swiglu": (True, False),
             "residual": (False, True), "both": (True, True)}


def _inputs(request, m, e, o, fmt, epilogue, dtype=jnp.bfloat16):
  """x, (w, scale), and the epilogue keywords, all from the test's key."""
  w_dtype, group, _ = FORMATS[fmt]
  swiglu, residual = EPILOGUES[epilogue]
  r = rng(request)
  x = normal(r, (m, e), dtype)
  weight = lambda: compiled(reference.quantize)(
      normal(r, (o, e), scale=e ** -0.5), w_dtype, group)
  w, s = weight()
  kw = {}
  if swiglu:
    kw["w_up_OxE"], kw["scale_up_OxZ"] = weight()
  if residual:
    kw["residual_MxO"] = normal(r, (m, o), dtype)
  return x, w, s, kw


def _check(fmt, x, w, s, kw, got, tol=None):
  want = compiled(reference.matmul)(x, w, s, activations=FORMATS[fmt][2],
                                    **kw)
  assert got.shape == want.shape and got.dtype == x.dtype
  assert np.isfinite(f32(got)).all()
  assert_close(got, want, x.dtype.type, tol)


IMPLS = ["pallas_interpret", "xla", gpu("pallas")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("epilogue", ["plain", "swiglu", "residual"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matches_reference(request, fmt, epilogue, impl):
  x, w, s, kw = _inputs(request, 33, 384, 100, fmt, epilogue)
  _check(fmt, x, w, s, kw, api.matmul(
      x, w, s, **kw, activations=FORMATS[fmt][2], implementation=impl))


# (M, E, O, tiling): one row, E with a masked tail, O not a multiple of the
# column tile, E = 8 tiles split 3 ways, a 64-row tile over 200 rows.
SHAPES = {
    "m1": (1, 256, 80, {}),
    "e_tail": (16, 200, 64, dict(block_e=64)),
    "e1024_split3": (17, 1024, 96, dict(split_e=3)),
    "m200_bm64": (200, 256, 130, dict(block_m=64, block_n=32)),
}


@pytest.mark.parametrize("fmt", ["int8", "fp8_w8a8"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_odd_shapes_and_tiles(request, shape, fmt):
  m, e, o, tiling = SHAPES[shape]
  x, w, s, kw = _inputs(request, m, e, o, fmt, "both")
  got = kernel.matmul(x, w, s, **kw, activations=FORMATS[fmt][2],
                      interpret=True, **tiling)
  _check(fmt, x, w, s, kw, got)


def test_float32_rows_weight_only(request):
  x, w, s, kw = _inputs(request, 5, 256, 48, "int8_g128", "residual",
                        jnp.float32)
  for impl in ("pallas_interpret", "xla"):
    _check("int8_g128", x, w, s, kw,
           api.matmul(x, w, s, **kw, implementation=impl),
           dict(rtol=1e-5, atol=1e-5))


def _rows_of(impl, fmt, epilogue, e, o, tiling, request, ms):
  """The kernel on x[:M] for each M: every result's rows equal the largest
  M's first rows bit for bit (bf16 bits as uint16)."""
  x, w, s, kw = _inputs(request, max(ms), e, o, fmt, epilogue)
  outs = []
  for m in ms:
    more = dict(kw)
    if "residual_MxO" in more:
      more["residual_MxO"] = kw["residual_MxO"][:m]
    y = api.matmul(x[:m], w, s, **more, activations=FORMATS[fmt][2],
                   implementation=impl, **tiling)
    outs.append(np.asarray(jax.lax.bitcast_convert_type(y, jnp.uint16)))
  for m, y in zip(ms, outs):
    np.testing.assert_array_equal(y, outs[-1][:m], err_msg=f"M={m}")


# (format, epilogue, E, O, tiling): the fused epilogue and split-E partials.
INVARIANCE = [("int8_g128", "swiglu", 256, 96, dict(split_e=2)),
              ("fp8_w8a8", "residual", 256, 96, dict(split_e=1)),
              ("fp8", "plain", 512, 64, {}),
              ("int8_w8a8_g128", "both", 384, 80, dict(split_e=3))]


@pytest.mark.parametrize("fmt,epilogue,e,o,tiling", INVARIANCE,
                         ids=[c[0] for c in INVARIANCE])
def test_rows_do_not_depend_on_m(request, fmt, epilogue, e, o, tiling):
  _rows_of("pallas_interpret", fmt, epilogue, e, o, tiling, request,
           (1, 16, 64, 200, 300))


def test_default_split_ignores_m_and_fills_the_gpu():
  assert kernel.default_split(4096, 4096, 64, 128) > 1  # q/k/v/o
  assert kernel.default_split(12288, 4096, 64, 128) == 2
  assert kernel.default_split(64, 256, 64, 128) == 1


def test_what_the_kernel_cannot_take_falls_through_to_xla(request):
  x, w, s, kw = _inputs(request, 9, 256, 64, "int8", "swiglu")
  r = rng(request)
  (w64, s64), (u64, su64) = (reference.quantize(
      normal(r, (64, 256), scale=1 / 16), jnp.int8, 64) for _ in range(2))
  kw64 = dict(w_up_OxE=u64, scale_up_OxZ=su64)
  with pytest.raises(NotImplementedError, match="block_e=64"):
    kernel.matmul(x, w64, s64, **kw64, interpret=True)
  _check("int8", x, w64, s64, kw64, kernel.matmul(
      x, w64, s64, **kw64, interpret=True, block_e=64))
  _check("int8", x, w64, s64, kw64,
         api.matmul(x, w64, s64, **kw64, implementation="pallas_interpret"))
  with pytest.raises(NotImplementedError, match="powers of two"):
    kernel.matmul(x, w, s, **kw, interpret=True, block_n=48)
  _check("int8", x, w, s, kw, api.matmul(
      x, w, s, **kw, implementation="pallas_interpret", block_n=48))


def test_default_is_the_reference_off_gpu(request):
  x, w, s, kw = _inputs(request, 3, 128, 32, "fp8_w8a8", "plain")
  np.testing.assert_array_equal(
      f32(api.matmul(x, w, s, activations="fp8")),
      f32(reference.matmul(x, w, s, activations="fp8")))


def _bad(request):
  x, w, s, _ = _inputs(request, 4, 256, 32, "int8_g128", "plain")
  return x, w, s


@pytest.mark.parametrize("change,match", [
    (lambda x, w, s: (x, w.astype(jnp.bfloat16), s), "w_OxE dtype"),
    (lambda x, w, s: (x, w[:, :128], s), "w_OxE must be"),
    (lambda x, w, s: (x, w, s[:16]), "scale_OxZ must be"),
    (lambda x, w, s: (x, w, s[:, :1].repeat(3, 1)), "do not divide"),
    (lambda x, w, s: (x, w, s.astype(jnp.bfloat16)), "scale_OxZ dtype"),
    (lambda x, w, s: (x.astype(jnp.int32), w, s), "x_MxE"),
], ids=["w_dtype", "w_width", "scale_rows", "groups", "scale_dtype", "x"])
def test_bad_arguments_are_named(request, change, match):
  x, w, s = change(*_bad(request))
  with pytest.raises(ValueError, match=match):
    api.matmul(x, w, s, implementation="xla")


def test_bad_options_are_named(request):
  x, w, s = _bad(request)
  with pytest.raises(ValueError, match="activations"):
    api.matmul(x, w, s, activations="int4")
  with pytest.raises(ValueError, match="implementation"):
    api.matmul(x, w, s, implementation="cublas")
  with pytest.raises(ValueError, match="come together"):
    api.matmul(x, w, s, w_up_OxE=w)
  with pytest.raises(ValueError, match="must match"):
    api.matmul(x, w, s, w_up_OxE=w.astype(FP8), scale_up_OxZ=s)
  with pytest.raises(ValueError, match="residual_MxO must have shape"):
    api.matmul(x, w, s, residual_MxO=jnp.zeros((4, 31), jnp.bfloat16))


# LLaDA-8B's projections: (M, E, O, epilogue).
GPU_SHAPES = [(1, 4096, 4096, "plain"), (16, 4096, 12288, "swiglu"),
              (144, 12288, 4096, "residual"), (1024, 4096, 4096, "both")]


@gpu_only
@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda c: "x".join(
    map(str, c)))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_matches_reference_at_llada_shapes(request, fmt, shape, impl):
  m, e, o, epilogue = shape
  x, w, s, kw = _inputs(request, m, e, o, fmt, epilogue)
  _check(fmt, x, w, s, kw, api.matmul(
      x, w, s, **kw, activations=FORMATS[fmt][2], implementation=impl))


@gpu_only
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("epilogue,e,o", [("swiglu", 4096, 12288),
                                          ("residual", 12288, 4096),
                                          ("plain", 4096, 4096)])
def test_gpu_rows_do_not_depend_on_m(request, fmt, epilogue, e, o):
  _rows_of("pallas", fmt, epilogue, e, o, {}, request, (1, 16, 64, 200, 300))


@pytest.mark.parametrize("fmt", ["int8_g128", "int8_w8a8_g128",
                                 "fp8_w8a8_g128"])
def test_xla_group_scales_are_not_rounded_to_bf16(request, fmt):
  """Per-group scales keep float32 products on XLA's path: its bf16 outputs
  are the reference's bit for bit but for rare rounding ties (one bf16 copy
  of the scaled weight moves ~4 in 10)."""
  x, w, s, kw = _inputs(request, 64, 1024, 512, fmt, "plain")
  act = FORMATS[fmt][2]
  got = api.matmul(x, w, s, activations=act, implementation="xla")
  want = reference.matmul(x, w, s, activations=act)
  assert np.mean(f32(got) != f32(want)) < 0.01
