"""The Mosaic GPU matmul with 8-bit weights (pallas_kernels/qmatmul/mosaic.py)
in Mosaic GPU's interpret mode on the CPU against the plain-JAX reference:
int8 and e4m3 weights, the E split, SwiGLU and residual, row invariance,
and what it does not take falling through the api; its lowering for CUDA at
LLaDA-8B's shapes, on the CPU. GPU-marked tests run the compiled kernel on
a GPU (JAX_PLATFORMS=cuda).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.qmatmul import api, mosaic, reference
from pallas_kernels.qmatmul.reference import FP8
from tests.kernel_case import (assert_close, compiled, f32, gpu_only, normal,
                               rng)

WEIGHTS = {"int8": jnp.int8, "fp8": FP8}


@pytest.fixture(autouse=True)
def _fresh_interpreter():
  """An interpreted kernel that raised leaves state the next one trips on."""
  mosaic.reset_interpret_state()
  yield


def _inputs(request, m, e, o, weight, *, group=None, swiglu=False,
            residual=False):
  """x, w, scale and the epilogue keywords, all from the test's key."""
  r = rng(request)
  x = normal(r, (m, e), jnp.bfloat16)
  quantized = lambda: compiled(reference.quantize)(
      normal(r, (o, e), scale=e ** -0.5), WEIGHTS[weight], group)
  w, s = quantized()
  kw = {}
  if swiglu:
    kw["w_up_OxE"], kw["scale_up_OxZ"] = quantized()
  if residual:
    kw["residual_MxO"] = normal(r, (m, o), jnp.bfloat16)
  return x, w, s, kw


def _check(x, w, s, kw, got, activations="bf16"):
  want = compiled(reference.matmul)(x, w, s, activations=activations, **kw)
  assert got.shape == want.shape and got.dtype == x.dtype
  assert np.isfinite(f32(got)).all()
  assert_close(got, want, jnp.bfloat16)


def _bits(y):
  return np.asarray(jax.lax.bitcast_convert_type(y, jnp.uint16))


@pytest.mark.parametrize("m", [1, 16, 40])
@pytest.mark.parametrize("weight", list(WEIGHTS))
def test_matches_reference(request, weight, m):
  x, w, s, kw = _inputs(request, m, 256, 128, weight)
  _check(x, w, s, kw, mosaic.matmul(x, w, s, interpret=True))


# (M, E, O, tiling): the E split (4 blocks, 2 and 4 ways), 32-row wgmma
# tiles with 64-wide E blocks, 128-row weight tiles, one E block.
TILINGS = {
    "split2": (17, 512, 64, dict(split_e=2)),
    "split4": (33, 512, 128, dict(split_e=4)),
    "bm32_be64": (40, 256, 192, dict(block_m=32, block_e=64)),
    "bo128": (16, 256, 256, dict(block_o=128)),
    "one_block": (5, 128, 64, {}),
}


@pytest.mark.parametrize("weight", list(WEIGHTS))
@pytest.mark.parametrize("tiling", list(TILINGS))
def test_tilings_and_splits(request, tiling, weight):
  m, e, o, kw_tiles = TILINGS[tiling]
  x, w, s, kw = _inputs(request, m, e, o, weight)
  _check(x, w, s, kw, mosaic.matmul(x, w, s, interpret=True, **kw_tiles))


@pytest.mark.parametrize("swiglu,residual", [(True, False), (False, True),
                                             (True, True)],
                         ids=["swiglu", "residual", "both"])
def test_epilogues_through_the_api(request, swiglu, residual):
  x, w, s, kw = _inputs(request, 24, 256, 128, "fp8", swiglu=swiglu,
                        residual=residual)
  got = api.matmul(x, w, s, **kw, implementation="mosaic_interpret")
  _check(x, w, s, kw, got)
  np.testing.assert_array_equal(
      _bits(got), _bits(mosaic.matmul(x, w, s, **kw, interpret=True)))


def _rows_of(request, weight, e, o, ms, *, interpret, swiglu=False,
             residual=False, **tiling):
  """The kernel on x[:M] for each M: every result's rows equal the largest
  M's first rows bit for bit."""
  x, w, s, kw = _inputs(request, max(ms), e, o, weight, swiglu=swiglu,
                        residual=residual)
  outs = []
  for m in ms:
    more = dict(kw)
    if residual:
      more["residual_MxO"] = kw["residual_MxO"][:m]
    outs.append(_bits(mosaic.matmul(x[:m], w, s, **more, interpret=interpret,
                                    **tiling)))
  for m, y in zip(ms, outs):
    np.testing.assert_array_equal(y, outs[-1][:m], err_msg=f"M={m}")


@pytest.mark.parametrize("weight,tiling", [
    ("int8", {}), ("fp8", dict(split_e=2)),
    ("int8", dict(block_m=32, split_e=4))], ids=["int8", "fp8_split2",
                                                 "int8_bm32_split4"])
def test_rows_do_not_depend_on_m(request, weight, tiling):
  _rows_of(request, weight, 512, 128, (1, 16, 40), interpret=True,
           swiglu=weight == "int8", residual=True, **tiling)


# What mosaic.matmul does not take: (case, the message it raises).
UNSUPPORTED = {
    "o_not_a_multiple": "multiples of",
    "group_scales": "per-group",
    "w8a8": "W8A8",
    "float32_rows": "bfloat16 only",
    "too_many_rows": "pipeline stages",
}


def _unsupported(request, case):
  """(x, w, s, activations) for `case`; Triton takes every one of them."""
  m, o, group, act = 9, 128, None, "bf16"
  if case == "o_not_a_multiple":
    o = 100
  elif case == "group_scales":
    group = 128
  elif case == "w8a8":
    act = "fp8"
  elif case == "too_many_rows":
    m = 300
  x, w, s, _ = _inputs(request, m, 256, o, "int8", group=group)
  if case == "float32_rows":
    x = x.astype(jnp.float32)
  return x, w, s, act


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_what_it_cannot_take_falls_through_to_triton(request, case):
  x, w, s, act = _unsupported(request, case)
  with pytest.raises(NotImplementedError, match=UNSUPPORTED[case]):
    mosaic.matmul(x, w, s, activations=act, interpret=True)
  got = api.matmul(x, w, s, activations=act,
                   implementation="mosaic_interpret")
  np.testing.assert_array_equal(f32(got), f32(api.matmul(
      x, w, s, activations=act, implementation="pallas_interpret")))
  for want in (reference.matmul(x, w, s, activations=act),
               api.matmul(x, w, s, activations=act, implementation="xla")):
    assert_close(got, want, x.dtype.type)


def test_what_triton_cannot_take_either_falls_through_to_xla(request):
  """Groups of 64 need the Triton kernel's block_e=64, which the fall-through
  does not pass: the api ends at XLA, bit for bit."""
  x, w, s, _ = _inputs(request, 9, 256, 128, "int8", group=64)
  got = api.matmul(x, w, s, implementation="mosaic_interpret")
  np.testing.assert_array_equal(
      _bits(got), _bits(api.matmul(x, w, s, implementation="xla")))


def test_bad_tiles_are_not_implemented(request):
  x, w, s, _ = _inputs(request, 4, 256, 128, "int8")
  for tiles in (dict(block_o=32), dict(block_e=96), dict(block_m=8)):
    with pytest.raises(NotImplementedError, match="multiples of"):
      mosaic.matmul(x, w, s, interpret=True, **tiles)
  with pytest.raises(NotImplementedError, match="must divide"):
    mosaic.matmul(x, w, s, interpret=True, split_e=3)


def test_mosaic_is_not_the_default():
  assert "mosaic" in api.IMPLEMENTATIONS
  assert "mosaic_interpret" in api.IMPLEMENTATIONS
  assert api.resolve_implementation(None) in ("pallas", "reference")


# LLaDA-8B's projections in the decode regime: (M, E, O).
GPU_SHAPES = [(32, 4096, 4096), (16, 4096, 12288), (160, 12288, 4096)]


@pytest.mark.parametrize("shape", GPU_SHAPES,
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("weight", list(WEIGHTS))
def test_lowers_for_cuda_on_the_cpu(weight, shape):
  """The compiled path through Mosaic GPU's lowering (wgmma operand
  swizzles, TMA tiles, register layouts), without a GPU: one mosaic_gpu
  custom call. PTX is made only on a GPU."""
  m, e, o = shape
  S = jax.ShapeDtypeStruct
  text = jax.jit(mosaic.matmul).trace(
      S((m, e), jnp.bfloat16), S((o, e), WEIGHTS[weight]),
      S((o, 1), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
  assert re.findall(r"custom_call @([\w$.]+)", text) == ["mosaic_gpu_v2"]


@gpu_only
@pytest.mark.parametrize("shape", GPU_SHAPES,
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("weight", list(WEIGHTS))
def test_gpu_matches_reference_at_llada_shapes(request, weight, shape):
  m, e, o = shape
  x, w, s, kw = _inputs(request, m, e, o, weight)
  _check(x, w, s, kw, mosaic.matmul(x, w, s))
  text = jax.jit(mosaic.matmul).lower(x, w, s).as_text()
  assert "mosaic_gpu" in text and "triton" not in text


@gpu_only
@pytest.mark.parametrize("weight", list(WEIGHTS))
def test_gpu_rows_do_not_depend_on_m(request, weight):
  _rows_of(request, weight, 4096, 4096, (1, 16, 32, 160), interpret=False,
           swiglu=True, residual=True)
