"""Public entry: per-row token log-probabilities, kernel or reference."""

import jax

from pallas_kernels.common import resolve_implementation
from pallas_kernels.token_logprob import kernel, reference


def token_logprob(logits_NxV: jax.Array, tokens_N: jax.Array, *,
                  implementation: str | None = None) -> jax.Array:
  """[N] float32 log softmax(logits)[token] per row.

  implementation: 'pallas', 'pallas_interpret', 'reference', or None (pallas
  on GPU, reference elsewhere). The kernel's result for a row does not
  depend on N; the reference's may, on a GPU.
  """
  impl = resolve_implementation(implementation)
  if impl != "reference":
    try:
      return kernel.token_logprob(logits_NxV, tokens_N,
                                  interpret=impl == "pallas_interpret")
    except NotImplementedError:
      pass
  return reference.token_logprob(logits_NxV, tokens_N)
