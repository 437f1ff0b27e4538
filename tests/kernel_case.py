"""The shared base of the kernel tests (`tests/test_kernel_*.py`).

Each kernel is tested the same way: run it in Pallas interpret mode on the
CPU (the GPU variant, `pallas`, is marked `gpu` and skipped off a GPU) and
compare it with its plain-JAX reference at a per-dtype tolerance. A new
kernel's tests are one file that imports this module."""

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ON_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")
# Marks of a test that runs the compiled (Triton) kernel: GPU only.
GPU = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a GPU")]
# The implementations a kernel-vs-reference test runs over, as parameters.
IMPLS = ["pallas_interpret", pytest.param("pallas", marks=GPU)]
# Kernel against reference: the sums differ in order only.
TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5),
       jnp.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def gpu(*values):
  """A parameter set that runs only on a GPU."""
  return pytest.param(*values, marks=GPU)


def gpu_only(test):
  """Marks a whole test as GPU only."""
  for mark in GPU:
    test = mark(test)
  return test


def rng(request) -> np.random.Generator:
  """A numpy generator seeded from the test's own name: stable per test id,
  and its draws compile nothing (each jax.random shape would)."""
  return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def on_device(x: np.ndarray, dtype=jnp.float32) -> jax.Array:
  """A numpy array rounded to float32, then to `dtype`, on the device."""
  return jnp.asarray(np.asarray(x, np.float32).astype(jnp.dtype(dtype)))


def normal(rng: np.random.Generator, shape, dtype=jnp.float32,
           scale: float = 1.0) -> jax.Array:
  """float32 N(0, scale^2) draws, rounded to `dtype`, on the device."""
  return on_device(rng.standard_normal(shape) * scale, dtype)


def f32(x):
  """An array as float32 numpy, for comparison."""
  return np.asarray(jnp.asarray(x, jnp.float32))


def assert_close(got, want, dtype=None, tol=None, table=TOL):
  """`got` equals `want` to `tol`, or to `table[dtype]`."""
  np.testing.assert_allclose(f32(got), f32(want), **(tol or table[dtype]))


def _is_static(value) -> bool:
  """An argument that holds no array (an option, None): a static one."""
  return not any(isinstance(x, (jax.Array, np.ndarray))
                 for x in jax.tree.leaves(value))


@functools.cache
def _jitted(fn, static_args, static_kw):
  def call(*args, **kw):
    args = list(args)
    for i, value in static_args:  # ascending positions
      args.insert(i, value)
    return fn(*args, **dict(static_kw), **kw)
  return jax.jit(call)


def compiled(fn):
  """`fn` (a plain-JAX reference) as one compiled program per shape and
  option: run op by op, each of its dozens of ops compiles (and goes to
  the run's persistent cache) at every new shape, about 2 s of CPU a call
  against 0.3 s. Arguments that hold no array (options, None) are
  static."""
  @functools.wraps(fn)
  def run(*args, **kw):
    static_args = tuple((i, a) for i, a in enumerate(args) if _is_static(a))
    static_kw = tuple(sorted((k, v) for k, v in kw.items() if _is_static(v)))
    names = {k for k, _ in static_kw}
    return _jitted(fn, static_args, static_kw)(
        *(a for a in args if not _is_static(a)),
        **{k: v for k, v in kw.items() if k not in names})
  return run
