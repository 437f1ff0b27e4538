"""The Mosaic GPU fused RoPE + cache write (pallas_kernels/cache_update/
mosaic.py) in Mosaic GPU's interpret mode on the CPU against the plain-JAX
reference: GQA, K = 1, H not a power of two, -1 slots, float32 and bf16
caches, rows no slot names left bit-identical; what it does not take falling
through the api; its lowering for CUDA (one aliased mosaic_gpu call) on the
CPU. GPU-marked tests run the compiled kernel (JAX_PLATFORMS=cuda).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.cache_update import api, mosaic, reference
from tests.kernel_case import gpu_only, rng
from tests.test_kernel_cache_update import THETA, _bits, _check, _inputs

F32, BF16 = jnp.float32, jnp.bfloat16
DTYPES = pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])


@pytest.fixture(autouse=True)
def _fresh_interpreter():
  """An interpreted kernel that raised leaves state the next one trips on."""
  mosaic.reset_interpret_state()
  yield


def _run(args, scale=1.0, implementation="mosaic_interpret", donate=False):
  fn = functools.partial(api.rope_write, theta=THETA, scale=scale,
                         implementation=implementation)
  if donate:
    fn = jax.jit(fn, donate_argnums=(5, 6))
    args = [*args[:5], jnp.array(args[5]), jnp.array(args[6])]
  return fn(*args)


# (B, Q, H, K, D, S), tiny: the interpreter runs B * Q programs one by one.
CASES = [
    (2, 3, 2, 2, 64, 10),   # G = 1
    (1, 4, 8, 2, 128, 20),  # G = 4, LLaDA/Dream head_dim
    (2, 2, 7, 1, 64, 30),   # G = 7, H not a power of two, K = 1
    (1, 3, 4, 4, 32, 9),    # head_dim 32: 16-head chunks, all padding
]


@DTYPES
@pytest.mark.parametrize("shape", CASES, ids=lambda c: "x".join(map(str, c)))
def test_matches_reference(request, shape, dtype):
  b, q, h, kh, d, s = shape
  args = _inputs(rng(request), b, q, h, kh, d, s, dtype, n_skip=1)
  outs = mosaic.rope_write(*args, theta=THETA, scale=d ** -0.5,
                           interpret=True)
  _check(args, outs, dtype, d ** -0.5)


def test_through_the_api_donated_equals_the_kernel(request):
  """jit with donated caches, via the api: the kernel's bits."""
  args = _inputs(rng(request), 2, 3, 4, 2, 64, 12, BF16)
  got = _run(args, 0.125, donate=True)
  want = mosaic.rope_write(*args, theta=THETA, scale=0.125, interpret=True)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(_bits(g), _bits(w))
  _check(args, got, BF16, 0.125)


def test_all_slots_skipped_leaves_cache_bit_identical(request):
  args = _inputs(rng(request), 1, 3, 4, 2, 64, 8, BF16, n_skip=3)
  outs = _run(args)
  np.testing.assert_array_equal(_bits(outs[1]), _bits(args[5]))
  np.testing.assert_array_equal(_bits(outs[2]), _bits(args[6]))
  _check(args, outs, BF16, 1.0)


def test_out_of_range_slot_is_skipped(request):
  """A slot >= S is dropped like -1 (the reference's mode='drop')."""
  args = list(_inputs(rng(request), 1, 3, 2, 2, 64, 8, F32, n_skip=0))
  args[4] = args[4].at[0, 1].set(8)
  got, want = _run(args), reference.rope_write(*args, theta=THETA)
  for g, w in zip(got, want):  # the NaN sentinel rows included
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                               atol=1e-5, equal_nan=True)


# What mosaic.rope_write does not take: case -> (the message it raises,
# whether the Triton kernel takes it; else the api ends at the reference).
UNSUPPORTED = {
    "k_dtype_not_the_caches": ("dtype must match", True),
    "head_dim_48": ("head_dim 48", False),
    "head_dim_96": ("head_dim 96", False),
}


def _unsupported(request, case):
  d = {"head_dim_48": 48, "head_dim_96": 96}.get(case, 64)
  args = list(_inputs(rng(request), 1, 3, 4, 2, d, 8, F32))
  if case == "k_dtype_not_the_caches":
    args[1] = args[1].astype(BF16)
  return args


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_what_it_cannot_take_falls_through(request, case):
  message, triton_takes = UNSUPPORTED[case]
  args = _unsupported(request, case)
  with pytest.raises(NotImplementedError, match=message):
    mosaic.rope_write(*args, theta=THETA, interpret=True)
  got = _run(args)
  want = (_run(args, implementation="pallas_interpret") if triton_takes
          else reference.rope_write(*args, theta=THETA))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(_bits(g), _bits(w))
  # a bf16 k: the reference rounds the rotated k to bf16, Triton does not
  _check(args, got, BF16 if triton_takes else F32, 1.0)


@pytest.mark.parametrize("h,d", [(257, 32), (4, 512)], ids=["heads", "d512"])
def test_past_a_tma_box_is_not_implemented(h, d):
  """More than 256 rows or columns in one copy; checked before tracing."""
  z = lambda *shape: jnp.zeros(shape, F32)
  with pytest.raises(NotImplementedError, match="TMA box"):
    mosaic.rope_write(z(1, 1, h, d), z(1, 1, 1, d), z(1, 1, 1, d),
                      z(1, 1).astype(jnp.int32), z(1, 1).astype(jnp.int32),
                      z(1, 2, 1, d), z(1, 2, 1, d), theta=THETA,
                      interpret=True)


def test_mosaic_is_not_the_default():
  assert {"mosaic", "mosaic_interpret"} <= set(api.IMPLEMENTATIONS)
  from pallas_kernels.common import resolve_implementation
  assert resolve_implementation(None) in ("pallas", "reference")
  with pytest.raises(ValueError, match="implementation must be one of"):
    _run(_inputs(np.random.default_rng(0), 1, 1, 2, 2, 64, 4, F32),
         implementation="mosaic_gpu")


S = jax.ShapeDtypeStruct
LOWER_SHAPES = [  # (B, Q, H, K, D, S, dtype)
    (4, 144, 32, 32, 128, 1280, BF16),  # LLaDA-8B
    (32, 16, 28, 4, 128, 1280, BF16),   # Dream-7B, batch 32
    (2, 5, 7, 1, 64, 300, F32),         # K = 1, float32 caches
]


@pytest.mark.parametrize("shape", LOWER_SHAPES,
                         ids=lambda c: "x".join(map(str, c[:6])))
def test_lowers_for_cuda_on_the_cpu(shape):
  """The compiled path through Mosaic GPU's lowering (TMA copies, strided
  register layouts, the scalar slot loads), without a GPU: one mosaic_gpu
  custom call that aliases both donated caches. PTX is made only on a GPU."""
  b, q, h, kh, d, s, dt = shape
  args = (S((b, q, h, d), dt), S((b, q, kh, d), dt), S((b, q, kh, d), dt),
          S((b, q), jnp.int32), S((b, q), jnp.int32), S((b, s, kh, d), dt),
          S((b, s, kh, d), dt))
  fn = jax.jit(functools.partial(mosaic.rope_write, theta=500000.0,
                                 scale=0.088), donate_argnums=(5, 6))
  lowered = fn.trace(*args).lower(lowering_platforms=("cuda",))
  text = lowered.as_text()
  assert re.findall(r"custom_call @([\w$.]+)", text) == ["mosaic_gpu_v2"]
  header = lowered.as_text(dialect="hlo").splitlines()[0]
  assert re.search(r"\{1\}: \(5, \{\}", header), header
  assert re.search(r"\{2\}: \(6, \{\}", header), header


@gpu_only
@DTYPES
@pytest.mark.parametrize("shape", CASES + [
    (3, 16, 8, 2, 128, 70), (1, 32, 28, 4, 128, 96),
    (8, 128, 32, 32, 128, 1024)], ids=lambda c: "x".join(map(str, c)))
def test_gpu_matches_reference(request, shape, dtype):
  b, q, h, kh, d, s = shape
  args = _inputs(rng(request), b, q, h, kh, d, s, dtype, n_skip=min(2, q - 1))
  outs = _run(args, d ** -0.5, implementation="mosaic", donate=True)
  _check(args, outs, dtype, d ** -0.5)
  text = jax.jit(functools.partial(mosaic.rope_write, theta=THETA)).lower(
      *args).as_text()
  assert "mosaic_gpu" in text and "triton" not in text


@gpu_only
def test_gpu_equals_triton_on_the_cache(request):
  """Both kernels rotate in float32 from the same inv_freq bits."""
  args = _inputs(rng(request), 4, 32, 32, 8, 128, 256, BF16)
  got = _run(args, 0.088, implementation="mosaic", donate=True)
  want = _run(args, 0.088, implementation="pallas", donate=True)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32),
                               np.asarray(w, np.float32), rtol=1e-2,
                               atol=1e-2, equal_nan=True)


def test_kernels_cache_update_mosaic_runs_the_mosaic_kernel(monkeypatch):
  """ops.rope_and_write under Kernels(cache_update="mosaic") asks the api
  for Mosaic GPU (its interpret mode under "pallas_interpret") and returns
  that kernel's bits; the default Kernels asks for the Triton kernel; an
  unknown backend is refused."""
  from flash_dllm_jax import ops
  from flash_dllm_jax.model.layers import apply_rope, rope_angles
  b, q, h, k, d, s = 1, 3, 4, 2, 32, 16
  rng = np.random.default_rng(5)
  arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q_, k_, v_ = arr(b, q, h, d), arr(b, q, k, d), arr(b, q, k, d)
  pos = jnp.asarray([[3, 4, 9]], jnp.int32)
  slots = jnp.asarray([[3, -1, 9]], jnp.int32)
  kc, vc = arr(b, s, k, d), arr(b, s, k, d)
  cos, sin = rope_angles(pos, d, 10000.0)
  rope = lambda x, _: apply_rope(x, cos, sin, True)
  asked = []
  real = api.rope_write
  monkeypatch.setattr(api, "rope_write", lambda *a, implementation, **kw: (
      asked.append(implementation), real(*a, implementation=implementation,
                                         **kw))[1])
  run = lambda kernels: ops.rope_and_write(
      q_, k_, v_, pos, slots, kc, vc, theta=10000.0, scale=0.5,
      rope_fn=rope, implementation=kernels)
  got = run(ops.Kernels("pallas_interpret", cache_update="mosaic"))
  assert asked[-1] == "mosaic_interpret"
  want = real(q_, k_, v_, pos, slots, kc, vc, theta=10000.0, scale=0.5,
              implementation="mosaic_interpret")
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  run(ops.Kernels("pallas_interpret"))
  assert asked[-1] == "pallas_interpret"
  with pytest.raises(ValueError, match="cache_update must be one of"):
    ops.Kernels(cache_update="cutlass")
