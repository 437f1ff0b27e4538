"""Row-wise ops whose sums run in one order per row: RMSNorm and token
log-probabilities."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel
from flash_dllm_jax.ops.choice import kernel_name
from pallas_kernels.rms_norm import api as norm_api
from pallas_kernels.token_logprob import api as logprob_api


def rms_norm(x_BxQxE: jax.Array, scale_E: jax.Array, *, eps: float,
             implementation: str | None = None) -> jax.Array:
  """scale * x / rms(x) over the last axis, in x's dtype (float32 inside).

  On a GPU the kernel, whose sum over E runs in one order wherever the norm
  lands: XLA's reduction followed its fusion, and one device and a
  tensor-parallel mesh fused it differently (the first bits that moved
  under model=2 on the H200). Under a mesh it runs per data shard on whole
  rows (replicated over "model"), as on one device.
  """
  impl = kernel_name(implementation)
  norm = lambda x, scale: norm_api.rms_norm(x, scale, eps=eps,
                                            implementation=impl)
  mesh = parallel.active_mesh() if impl != "reference" else None
  if mesh is not None:
    norm = parallel.shard_map(norm, mesh, (P("data"), P()), P("data"))
  return norm(x_BxQxE, scale_E)


def token_logprob(logits_BxRxV: jax.Array, tokens_BxR: jax.Array, *,
                  implementation: str | None = None) -> jax.Array:
  """[B, R] float32 log softmax(logits)[token]: what confidences, sampler
  thresholds and verify acceptances are made of.

  On a GPU the kernel, whose sum over the vocabulary runs in one order
  whatever the number of rows (XLA's order changed with it, which flipped
  near-threshold commits between batch sizes); per data shard under a mesh.
  """
  impl = kernel_name(implementation)
  _, r, v = logits_BxRxV.shape

  def logprob(logits, tokens):
    n = logits.shape[0] * r
    return logprob_api.token_logprob(
        logits.reshape(n, v), tokens.reshape(n),
        implementation=impl).reshape(tokens.shape)

  mesh = parallel.active_mesh() if impl != "reference" else None
  if mesh is not None:
    logprob = parallel.shard_map(logprob, mesh, (P("data"), P("data")),
                                 P("data"))
  return logprob(logits_BxRxV, tokens_BxR)
