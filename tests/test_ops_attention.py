"""The fused (cuDNN-capable) attention equals the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from pallas_kernels.attention import fused
from pallas_kernels.attention.reference import masked_attention
from tests.kernel_case import compiled, normal


def _inputs(seed, b, q, s, h, k, d, dtype):
  rng = np.random.default_rng(seed)
  q_, k_, v_ = (normal(rng, shape, dtype) for shape in
                [(b, q, h, d), (b, s, k, d), (b, s, k, d)])
  lengths = rng.integers(1, s + 1, b)
  valid = np.arange(s)[None, :] >= s - lengths[:, None]  # left padding
  valid[0] = False  # row 0: no valid key at all
  valid[1] = np.arange(s) < s // 2  # row 1: right padding
  return q_, k_, v_, jnp.asarray(valid)


@pytest.mark.parametrize("h,k,d", [(4, 4, 64), (8, 2, 64), (7, 1, 128)])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5),
                                       (jnp.bfloat16, 3e-2)])
def test_fused_attention_matches_the_reference(h, k, d, dtype, tol):
  q_, k_, v_, valid = _inputs(h * 10 + d, 4, 24, 24, h, k, d, dtype)
  scale = d ** -0.5
  want = compiled(masked_attention)(q_, k_, v_, valid, scale=scale)
  got = compiled(fused.fused_attention)(q_, k_, v_, valid, scale=scale,
                                        xla_impl="xla")
  assert got.dtype == want.dtype and got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             np.asarray(want, np.float32), atol=tol, rtol=tol)
  # The row without valid keys is the uniform average of the values.
  mean_v = np.asarray(v_[0].astype(jnp.float32)).mean(0)  # [K, D]
  np.testing.assert_allclose(np.asarray(got[0, 0], np.float32),
                             np.repeat(mean_v, h // k, axis=0), atol=tol)


def test_off_gpu_paths_are_the_reference_bit_for_bit():
  q_, k_, v_, valid = _inputs(3, 3, 16, 16, 8, 2, 64, jnp.float32)
  want = masked_attention(q_, k_, v_, valid, scale=0.125)
  for impl in (None, "reference", "pallas_interpret"):
    got = ops.attention(q_, k_, v_, valid, scale=0.125, implementation=impl)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.gpu
def test_gpu_fused_attention_matches_the_reference_at_training_shapes():
  q_, k_, v_, valid = _inputs(5, 8, 320, 320, 6, 6, 64, jnp.bfloat16)
  want = masked_attention(q_, k_, v_, valid, scale=0.125)
  got = jax.jit(lambda *a: ops.attention(*a, scale=0.125))(q_, k_, v_, valid)
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             np.asarray(want, np.float32), atol=3e-2,
                             rtol=3e-2)
  grad = jax.grad(lambda q: ops.attention(q, k_, v_, valid, scale=0.125)
                  .astype(jnp.float32).sum())(q_)
  assert bool(jnp.all(jnp.isfinite(grad.astype(jnp.float32))))
