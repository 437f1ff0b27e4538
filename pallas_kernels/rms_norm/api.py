"""Public entry: RMSNorm over the last axis, kernel or reference."""

import functools

import jax

from pallas_kernels.common import resolve_implementation
from pallas_kernels.rms_norm import kernel, reference


def rms_norm(x_NxE: jax.Array, scale_E: jax.Array, *, eps: float,
             implementation: str | None = None) -> jax.Array:
  """scale * x / rms(x) per row of x_...xE, in x's dtype.

  implementation: 'pallas', 'pallas_interpret', 'reference', or None (pallas
  on GPU, reference elsewhere). The kernel's result for a row does not depend
  on the other rows or on the surrounding program; it is differentiable
  (the backward pass is the reference's).
  """
  impl = resolve_implementation(implementation)
  if impl == "reference" or x_NxE.shape[-1] > kernel.MAX_E:
    return reference.rms_norm(x_NxE, scale_E, eps=eps)
  shape = x_NxE.shape
  out = _differentiable(x_NxE.reshape(-1, shape[-1]), scale_E, eps,
                        impl == "pallas_interpret")
  return out.reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _differentiable(x_NxE, scale_E, eps, interpret):
  return kernel.rms_norm(x_NxE, scale_E, eps=eps, interpret=interpret)


def _forward(x_NxE, scale_E, eps, interpret):
  return _differentiable(x_NxE, scale_E, eps, interpret), (x_NxE, scale_E)


def _backward(eps, interpret, saved, grad_NxE):
  del interpret
  _, vjp = jax.vjp(functools.partial(reference.rms_norm, eps=eps), *saved)
  return vjp(grad_NxE)


_differentiable.defvjp(_forward, _backward)
