"""Fused RoPE + in-place cache write (pallas_kernels/cache_update) vs reference.

CPU runs the kernel in Pallas interpret mode; GPU-marked tests run Triton
(tests/conftest.py defaults JAX_PLATFORMS to cpu: run them with
JAX_PLATFORMS=cuda).
"""

import functools
import re
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.cache_update import api, kernel, reference
from tests import kernel_case
from tests.kernel_case import (assert_close, compiled, gpu_only, normal,
                               on_device, rng as _rng)

# This kernel's bfloat16 rtol is a little looser than the base table's.
TOL = {**kernel_case.TOL, jnp.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}
THETA = 10000.0


def _inputs(rng, b, q, h, kh, d, s, dtype, n_skip=1):
  """Random q/k/v, positions, distinct slots (some -1), poisoned caches,
  from the numpy generator `rng`."""
  q_BxQxHxD = normal(rng, (b, q, h, d), dtype)
  k_BxQxKxD = normal(rng, (b, q, kh, d), dtype)
  v_BxQxKxD = normal(rng, (b, q, kh, d), dtype)
  positions_BxQ = jnp.asarray(rng.integers(0, 4096, (b, q)), jnp.int32)
  slots_BxQ = np.stack([rng.permutation(s)[:q] for _ in range(b)])
  slots_BxQ[:, q - n_skip:] = -1  # padding queries
  caches = rng.standard_normal((2, b, s, kh, d))
  # Sentinel rows: a NaN the kernel must neither read into outputs nor erase.
  caches[:, :, 1] = np.nan
  k_cache, v_cache = (on_device(c, dtype) for c in caches)
  return (q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ,
          jnp.asarray(slots_BxQ, jnp.int32), k_cache, v_cache)


def _bits(x):
  x = np.asarray(x)
  return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _check(args, outs, dtype, scale):
  ref = compiled(reference.rope_write)(*args, theta=THETA, scale=scale)
  slots = np.asarray(args[4])
  written = np.zeros(np.asarray(args[5]).shape[:2], bool)
  for bi, row in enumerate(slots):
    written[bi, row[row >= 0]] = True
  q_out = np.asarray(outs[0], np.float32)
  assert np.isfinite(q_out).all()
  assert_close(q_out, ref[0], dtype, table=TOL)
  for got, want, old in zip(outs[1:], ref[1:], args[5:]):
    got_bits, old_bits = _bits(got), _bits(old)
    # Rows no slot names are bit-identical to the input (sentinels included).
    np.testing.assert_array_equal(got_bits[~written], old_bits[~written])
    got_w = np.asarray(got, np.float32)[written]
    assert np.isfinite(got_w).all()
    assert_close(got_w, np.asarray(want, np.float32)[written], dtype,
                 table=TOL)


CASES = [  # (B, Q, H, K, D, S)
    (2, 5, 2, 2, 64, 40),     # G = 1
    (3, 16, 8, 2, 128, 70),   # G = 4
    (2, 7, 7, 1, 64, 300),    # G = 7, H not a power of two
    (1, 32, 28, 4, 128, 96),  # Dream-7B head layout
    (1, 3, 4, 4, 128, 41),    # LLaDA-like G = 1
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", CASES, ids=lambda c: "x".join(map(str, c)))
def test_matches_reference(request, shape, dtype):
  b, q, h, kh, d, s = shape
  args = _inputs(_rng(request), b, q, h, kh, d, s, dtype, n_skip=min(2, q - 1))
  outs = api.rope_write(*args, theta=THETA, scale=d ** -0.5,
                        implementation="pallas_interpret")
  _check(args, outs, dtype, d ** -0.5)


def test_all_slots_skipped_leaves_cache_bit_identical(request):
  args = _inputs(_rng(request), 2, 4, 4, 2, 64, 50, jnp.bfloat16, n_skip=4)
  outs = api.rope_write(*args, theta=THETA, implementation="pallas_interpret")
  np.testing.assert_array_equal(_bits(outs[1]), _bits(args[5]))
  np.testing.assert_array_equal(_bits(outs[2]), _bits(args[6]))
  _check(args, outs, jnp.bfloat16, 1.0)


def test_donated_write_is_in_place(request):
  """Compiled HLO aliases both caches to outputs and never copies them."""
  b, q, h, kh, d, s = 2, 4, 8, 2, 64, 37
  args = _inputs(_rng(request), b, q, h, kh, d, s, jnp.float32)
  fn = jax.jit(functools.partial(api.rope_write, theta=THETA, scale=0.125,
                                 implementation="pallas_interpret"),
               donate_argnums=(5, 6))
  hlo = fn.lower(*args).compile().as_text()
  header = hlo.splitlines()[0]
  assert "input_output_alias" in header
  assert re.search(r"\{1\}: \(5, \{\}", header), header
  assert re.search(r"\{2\}: \(6, \{\}", header), header
  cache_ty = re.escape(f"f32[{b},{s},{kh},{d}]")
  assert not re.search(cache_ty + r"\S* copy\(", hlo)
  expected = reference.rope_write(*args, theta=THETA, scale=0.125)
  outs = fn(*[jnp.array(a) for a in args])
  for got, want in zip(outs, expected):
    assert_close(got, want, jnp.float32)


def test_reference_rotation_matches_model_formula(request):
  """rotate() is x*cos + rotate_half(x)*sin with duplicated-half angles."""
  x = normal(_rng(request), (1, 3, 2, 8))
  pos = jnp.array([[0, 5, 900]])
  inv = 1.0 / (THETA ** (np.arange(0, 8, 2) / 8))
  ang = np.asarray(pos)[..., None] * inv
  ang = np.concatenate([ang, ang], -1)[:, :, None, :]
  xn = np.asarray(x, np.float64)
  rot = np.concatenate([-xn[..., 4:], xn[..., :4]], -1)
  want = xn * np.cos(ang) + rot * np.sin(ang)
  np.testing.assert_allclose(np.asarray(reference.rotate(x, pos, THETA)),
                             want, rtol=1e-5, atol=1e-5)


def test_unsupported_head_dim_falls_back(request):
  args = _inputs(_rng(request), 1, 3, 2, 1, 48, 20, jnp.float32)
  with pytest.raises(NotImplementedError):
    kernel.rope_write(*args, theta=THETA, interpret=True)
  outs = api.rope_write(*args, theta=THETA, implementation="pallas_interpret")
  _check(args, outs, jnp.float32, 1.0)


def test_auto_implementation_off_gpu_is_reference(request):
  args = _inputs(_rng(request), 1, 3, 2, 1, 64, 20, jnp.float32)
  outs = api.rope_write(*args, theta=THETA)
  _check(args, outs, jnp.float32, 1.0)


@gpu_only
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", CASES + [(8, 128, 32, 32, 128, 1024)],
                         ids=lambda c: "x".join(map(str, c)))
def test_triton_matches_reference(request, shape, dtype):
  b, q, h, kh, d, s = shape
  args = _inputs(_rng(request), b, q, h, kh, d, s, dtype, n_skip=min(2, q - 1))
  fn = jax.jit(functools.partial(api.rope_write, theta=THETA, scale=d ** -0.5,
                                 implementation="pallas"),
               donate_argnums=(5, 6))
  outs = fn(*[jnp.array(a) for a in args])
  _check(args, outs, dtype, d ** -0.5)
