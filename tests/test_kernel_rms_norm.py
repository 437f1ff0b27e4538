"""RMSNorm kernel against its reference (interpret mode on the CPU, the
Triton kernel on a GPU), its gradient, and the property it exists for: a
row's bits do not depend on the other rows or on the program around it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from pallas_kernels.rms_norm import api, kernel, reference
from tests.kernel_case import (IMPLS, assert_close, compiled, f32 as _f32, gpu,
                               normal, on_device, rng)

EPS = 1e-5
# The sums differ in order only: float32 agrees to rounding, bfloat16 to
# one unit in the last place where the rounding boundary moves.
TOL = {jnp.float32: dict(rtol=1e-6, atol=1e-6),
       jnp.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _inputs(request, n, e, dtype):
  r = rng(request)
  x = normal(r, (n, e), dtype, scale=3.0)
  scale = on_device(1.0 + 0.2 * r.standard_normal(e))
  return x, scale


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,e,dtype", [
    (1, 7, jnp.float32),            # a row narrower than its tile
    (13, 384, jnp.bfloat16),        # the shipped model; rows not a multiple
    (5, 3584, jnp.bfloat16),        # Dream-7B's width (padded to 4096)
    (9, 4096, jnp.float32)])        # LLaDA-8B's width
def test_kernel_matches_reference(request, impl, n, e, dtype):
  x, scale = _inputs(request, n, e, dtype)
  got = api.rms_norm(x, scale, eps=EPS, implementation=impl)
  want = compiled(reference.rms_norm)(x, scale, eps=EPS)
  assert got.dtype == x.dtype and got.shape == (n, e)
  assert_close(got, want, dtype, table=TOL)


@pytest.mark.parametrize("impl,n,e", [
    ("pallas_interpret", 37, 384),
    gpu("pallas", 37, 384), gpu("pallas", 128 * 144, 4096)])
def test_a_row_does_not_depend_on_the_rows_or_program_around_it(
    request, impl, n, e):
  """The first 9 rows alone, among n - 9 others, and behind a residual add
  fused into the same program give the same bits (XLA's own reduction moved
  a bit between one device and a model=2 mesh on the H200)."""
  x, scale = _inputs(request, n, e, jnp.bfloat16)
  norm = lambda x: api.rms_norm(x, scale, eps=EPS, implementation=impl)
  alone = jax.jit(norm)(x[:9])
  batch = jax.jit(norm)(x)
  fused = jax.jit(lambda a, b: norm(a + b))(x, jnp.zeros_like(x))
  np.testing.assert_array_equal(_f32(alone), _f32(batch[:9]))
  np.testing.assert_array_equal(_f32(batch), _f32(fused))


def test_gradient_is_the_references(request):
  x, scale = _inputs(request, 6, 384, jnp.float32)
  loss = lambda f: lambda x, s: jnp.sum(jnp.sin(f(x, s)))
  kern = lambda x, s: api.rms_norm(x, s, eps=EPS,
                                   implementation="pallas_interpret")
  ref = lambda x, s: reference.rms_norm(x, s, eps=EPS)
  got = jax.grad(loss(kern), argnums=(0, 1))(x, scale)
  want = jax.grad(loss(ref), argnums=(0, 1))(x, scale)
  for g, w in zip(got, want):
    assert_close(g, w, jnp.float32)


def test_ops_entry_keeps_leading_axes_and_the_reference_path_is_exact(
    request):
  x, scale = _inputs(request, 12, 96, jnp.bfloat16)
  x_BxQxE = x.reshape(3, 4, 96)
  got = ops.rms_norm(x_BxQxE, scale, eps=EPS,
                     implementation="pallas_interpret")
  want = ops.rms_norm(x_BxQxE, scale, eps=EPS, implementation="reference")
  assert got.shape == (3, 4, 96) and got.dtype == jnp.bfloat16
  assert_close(got, want, jnp.bfloat16)
  np.testing.assert_array_equal(
      _f32(want).reshape(12, 96), _f32(reference.rms_norm(x, scale, eps=EPS)))


def test_rows_wider_than_a_tile_take_the_reference():
  x = jnp.ones((2, kernel.MAX_E + 1), jnp.float32) * 2.0
  got = api.rms_norm(x, jnp.ones((kernel.MAX_E + 1,)), eps=EPS,
                     implementation="pallas_interpret")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(
      reference.rms_norm(x, jnp.ones((kernel.MAX_E + 1,)), eps=EPS)))
  np.testing.assert_allclose(np.asarray(got), 2.0 / np.sqrt(4.0 + EPS))
  with pytest.raises(NotImplementedError, match="elements"):
    kernel.rms_norm(x, jnp.ones((kernel.MAX_E + 1,)), eps=EPS, interpret=True)


def test_wrong_scale_shape_is_a_clear_error():
  with pytest.raises(ValueError, match=r"must be \[E\]"):
    kernel.rms_norm(jnp.zeros((4, 10)), jnp.zeros((9,)), eps=EPS,
                    interpret=True)
