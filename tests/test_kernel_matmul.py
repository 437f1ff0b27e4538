"""Weight-streaming small-M matmul (pallas_kernels/matmul) vs its reference.

CPU runs the kernel in Pallas interpret mode (whose outputs start as NaN, so
an unwritten element fails); GPU-marked tests run Triton
(tests/conftest.py defaults JAX_PLATFORMS to cpu: run them with
JAX_PLATFORMS=cuda).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.matmul import api, kernel, reference
from tests.kernel_case import assert_close, compiled, gpu_only, normal, rng


def _inputs(request, m, e, n, dtype, swiglu, residual):
  r = rng(request)
  x, w = normal(r, (m, e), dtype), normal(r, (e, n), dtype, e ** -0.5)
  kw = dict(w_up_ExO=normal(r, (e, n), dtype, e ** -0.5) if swiglu else None,
            residual_MxO=normal(r, (m, n), dtype) if residual else None)
  return x, w, kw


def _check(x, w, kw, got, dtype, tol=None):
  want = np.asarray(compiled(reference.matmul)(x, w, **kw), np.float32)
  got = np.asarray(got, np.float32)
  assert got.shape == want.shape and got.dtype == np.float32
  assert np.isfinite(got).all()
  assert_close(got, want, dtype, tol)


# (M, E, N, block_e, split_e)
CASES = {
    "m1": (1, 96, 80, 32, 1),
    "m16_split": (16, 256, 64, 64, 3),
    "m33": (33, 160, 100, 32, 1),
    "m160_split": (160, 128, 48, 32, 2),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("epilogue", ["plain", "swiglu", "residual", "both"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(request, name, epilogue, dtype):
  m, e, n, block_e, split = CASES[name]
  x, w, kw = _inputs(request, m, e, n, dtype, epilogue in ("swiglu", "both"),
                     epilogue in ("residual", "both"))
  got = api.matmul(x, w, **kw, implementation="pallas_interpret",
                   block_e=block_e, split_e=split)
  assert got.dtype == dtype
  _check(x, w, kw, got, dtype)


def test_default_split_fills_the_gpu():
  assert kernel.default_split(1, 512, 3584, 16, 64, 128) > 1
  assert kernel.default_split(16, 18944, 3584, 16, 64, 128) == 1
  assert kernel.default_split(1, 64, 64, 16, 64, 128) == 1


def test_large_m_falls_back(request):
  x, w, kw = _inputs(request, 300, 64, 32, jnp.float32, True, True)
  with pytest.raises(NotImplementedError):
    kernel.matmul(x, w, **kw, interpret=True)
  _check(x, w, kw, api.matmul(x, w, **kw, implementation="pallas_interpret"),
         jnp.float32)
  _check(x, w, kw, api.matmul(x, w, **kw), jnp.float32)


@gpu_only
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 4096, 12288), (32, 3584, 512),
                                   (160, 4096, 4096), (256, 3584, 18944)],
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("epilogue", ["plain", "both"])
def test_triton_matches_reference(request, shape, epilogue, dtype):
  m, e, n = shape
  x, w, kw = _inputs(request, m, e, n, dtype, epilogue == "both",
                     epilogue == "both")
  # float32 sums over E ~ 4000 in another order differ by ~2e-5 absolute.
  tol = dict(rtol=1e-5, atol=1e-4) if dtype == jnp.float32 else None
  _check(x, w, kw, api.matmul(x, w, **kw, implementation="pallas"), dtype,
         tol)
