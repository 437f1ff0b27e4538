"""The one dispatch point between model code and `pallas_kernels`.

Model code calls these functions and never imports a kernel. Each picks a
Pallas kernel where one exists for the backend and the shape measured faster
(BENCHMARKS.md, "Kernels") or where its fixed summation order keeps a row's
bits independent of batch and mesh, and the plain-JAX reference otherwise.

`implementation`: None chooses by backend (Pallas on a GPU, reference
elsewhere); 'reference', 'pallas' or 'pallas_interpret' (the kernel run by
the Pallas interpreter, how CPU tests exercise the kernel path) force one;
a `Kernels` adds kernel settings to that choice.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel, quantize
from pallas_kernels.attention import api as attention_api
from pallas_kernels.cache_update import api as cache_api
from pallas_kernels.cache_update import reference as cache_reference
from pallas_kernels.common import resolve_implementation
from pallas_kernels.qmatmul import api as qmatmul_api
from pallas_kernels.rms_norm import api as norm_api
from pallas_kernels.token_logprob import api as logprob_api


def linear(x_MxE: jax.Array, kernel_ExO: jax.Array,
           bias_O: jax.Array | None = None, *, gathered: bool = False
           ) -> jax.Array:
  """x @ W (+ b) in x's dtype, accumulating in float32.

  On a GPU, without a bias, the product is asked for in x's dtype directly:
  cuBLAS accumulates in float32 and rounds once on output, what the float32
  product and a cast give, but without writing the float32 product and
  converting it in another kernel (3 converts a layer for q/k/v, and SwiGLU
  reading float32 gate/up).
  Elsewhere, and under tensor parallelism, the product stays float32:
  XLA:CPU's bf16 dots on a tensor-parallel shard gave other values than one
  device's (tests/test_mesh_exact), and a GPU's were not checked there.

  XLA's dot: the Pallas small-M matmul wins only at M = 1 on the H200 and
  loses from M = 32 on, while decode steps run B x Q >= 16 rows.
  gathered (under a mesh, for a kernel column-sharded over "model"): x is
  all-gathered over "model" first and each device's output columns after,
  rows staying on "data". Every element is then one full-length dot
  product, as on one device; a row-sharded kernel would sum per-device
  partial products by an all-reduce, in another order.
  """
  active = parallel.active_mesh()
  mesh = active if gathered else None
  rows = P("data")
  if mesh is not None:
    x_MxE = jax.lax.with_sharding_constraint(x_MxE, rows)
  direct = (bias_O is None and jax.default_backend() == "gpu"
            and (active is None or active.shape["model"] == 1))
  y = jnp.einsum("...e,eo->...o", x_MxE, kernel_ExO.astype(x_MxE.dtype),
                 preferred_element_type=x_MxE.dtype if direct else jnp.float32)
  if mesh is not None and y.shape[-1] % mesh.shape["model"] == 0:
    # Computed on the kernel's column shard: never all-gather the weight.
    y = jax.lax.with_sharding_constraint(
        y, P("data", *[None] * (y.ndim - 2), "model"))
  if bias_O is not None:
    y = y + bias_O.astype(jnp.float32)
  y = y.astype(x_MxE.dtype)
  return y if mesh is None else jax.lax.with_sharding_constraint(y, rows)


# Rows per sequence (Q of x [B, Q, E]) up to which a GPU runs the
# weight-streaming kernel (decode steps); above it XLA's GEMM (cuBLASLt's
# fp8 GEMM for W8A8). Chosen by Q, never by B x Q, so that which kernel a
# row gets, and so its bits, never depends on the batch.
QMATMUL_STREAM_MAX_Q = 64


def quantized_linear(x_BxQxE: jax.Array, w_OxE: jax.Array,
                     scale_OxZ: jax.Array, bias_O: jax.Array | None = None,
                     *, fmt: str, up: tuple[jax.Array, jax.Array] | None = None,
                     residual_BxQxO: jax.Array | None = None,
                     gathered: bool = False,
                     implementation: "str | Kernels | None" = None
                     ) -> jax.Array:
  """x @ W^T (+ b), or silu(x @ W^T) * (x @ W_up^T) with up=(w_up, scale_up),
  plus residual_BxQxO, for 8-bit weights (quantize.py) in x's dtype.

  x is [..., Q, E], Q the rows of one sequence. On CPU the plain-JAX
  reference, with the activations the format has on the H200 (fp8 W8A8
  for "fp8"). On a GPU the weight-streaming kernel when Q <=
  QMATMUL_STREAM_MAX_Q (or Kernels.stream_max_q) and XLA's GEMM above.
  Under a mesh the weight is column-sharded over "model" like ops.linear's:
  the kernel runs per shard (rows on "data", its output columns on
  "model"); gathered gathers x before and the output columns after, so
  every element is the one-device dot product.
  """
  impl = _kernels(implementation)
  limit = getattr(implementation, "stream_max_q", None)
  if impl == "pallas" and x_BxQxE.shape[-2] > (
      QMATMUL_STREAM_MAX_Q if limit is None else limit):
    impl = "xla"
  acts = quantize.activations(fmt)
  o, ndim = w_OxE.shape[0], x_BxQxE.ndim
  mesh = parallel.active_mesh()
  col = "model" if mesh is not None and o % mesh.shape["model"] == 0 else None
  out_spec = P("data", *[None] * (ndim - 2), col)

  def product(x, w, s, b, w_up, s_up, residual):
    lead, o_local = x.shape[:-1], w.shape[0]
    x_MxE = x.reshape(-1, x.shape[-1])
    r_MxO = None if residual is None else residual.reshape(-1, o_local)
    if b is not None:
      b_MxO = jnp.broadcast_to(b, (x_MxE.shape[0], o_local))
      r_MxO = b_MxO if r_MxO is None else r_MxO + b_MxO
    y_MxO = qmatmul_api.matmul(x_MxE, w, s, w_up_OxE=w_up, scale_up_OxZ=s_up,
                               residual_MxO=r_MxO, activations=acts,
                               implementation=impl)
    return y_MxO.reshape(*lead, o_local)

  w_up, s_up = up if up is not None else (None, None)
  if mesh is None:
    return product(x_BxQxE, w_OxE, scale_OxZ, bias_O, w_up, s_up,
                   residual_BxQxO)
  # Whole rows of x and of the residual in, column shards out. Left free,
  # XLA propagated the residual add's column split back into the residual
  # stream, whose norms then summed over E across devices.
  rows = lambda a: None if a is None else (
      jax.lax.with_sharding_constraint(a, P("data")))
  args = (rows(x_BxQxE), w_OxE, scale_OxZ, bias_O, w_up, s_up,
          rows(residual_BxQxO))
  if impl in ("reference", "xla"):  # partitioned by XLA
    y = jax.lax.with_sharding_constraint(product(*args), out_spec)
  else:
    specs = (P("data"), P(col, None), P(col, None), P(col), P(col, None),
             P(col, None), out_spec)
    present = [i for i, a in enumerate(args) if a is not None]

    def shard(*arrays):
      full = [None] * len(args)
      for i, a in zip(present, arrays):
        full[i] = a
      return product(*full)

    y = parallel.shard_map(shard, mesh, tuple(specs[i] for i in present),
                           out_spec)(*(args[i] for i in present))
  return jax.lax.with_sharding_constraint(y, P("data")) if gathered else y


def rms_norm(x_BxQxE: jax.Array, scale_E: jax.Array, *, eps: float,
             implementation: str | None = None) -> jax.Array:
  """scale * x / rms(x) over the last axis, in x's dtype (float32 inside).

  On a GPU the kernel, whose sum over E runs in one order wherever the norm
  lands: XLA's reduction followed its fusion, and one device and a
  tensor-parallel mesh fused it differently (the first bits that moved
  under model=2 on the H200). Under a mesh it runs per data shard on whole
  rows (replicated over "model"), as on one device.
  """
  impl = _kernels(implementation)
  norm = lambda x, scale: norm_api.rms_norm(x, scale, eps=eps,
                                            implementation=impl)
  mesh = parallel.active_mesh() if impl != "reference" else None
  if mesh is not None:
    norm = parallel.shard_map(norm, mesh, (P("data"), P()), P("data"))
  return norm(x_BxQxE, scale_E)


def attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
              v_BxSxKxD: jax.Array, key_valid_BxS: jax.Array,
              *, scale: float, implementation: str | None = None
              ) -> jax.Array:
  """Bidirectional GQA attention of all queries over all keys (uncached
  forwards and training, Q = S).

  On a GPU (implementation resolving to 'pallas') this is JAX's fused
  attention, cuDNN's flash attention where it applies: the reference
  materialises B x H x Q x S float32 scores, about half of a training step's
  HBM traffic for the shipped model. Under a mesh it runs per shard (rows on
  'data', heads on 'model'), the same computation as on one device, so the
  mesh does not change which attention a row gets. Elsewhere, and for
  'pallas_interpret', the plain-JAX reference.
  """
  if _kernels(implementation) != "pallas":
    return attention_api.masked_attention(
        q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid_BxS, scale=scale,
        implementation="reference")
  attend = lambda q, k, v, valid: attention_api.masked_attention(
      q, k, v, valid, scale=scale, implementation="fused")
  mesh = parallel.active_mesh()
  if mesh is not None:
    heads = parallel.HEADS_SPEC
    attend = parallel.shard_map(attend, mesh,
                                (heads, heads, heads, P("data")), heads)
  return attend(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD, key_valid_BxS)


def write_cache(cache_BxSxKxD: jax.Array, new_BxQxKxD: jax.Array,
                slots_BxQ: jax.Array) -> jax.Array:
  """Writes fresh K or V rows at their cache slots (-1 = skip)."""
  return parallel.constrain(
      cache_reference.write_rows(cache_BxSxKxD, new_BxQxKxD, slots_BxQ),
      parallel.CACHE_SPEC)


@dataclasses.dataclass(frozen=True)
class Kernels:
  """A kernel choice with settings, accepted wherever `implementation` is:
  name as `implementation` (None: by backend), the attention kernel's
  tiling rules and the rows per sequence up to which 8-bit weights stream
  (`quantized_linear`; benchmarks sweep them; static, so part of the jit
  key)."""

  name: str | None = None
  attention: attention_api.Tiling = attention_api.Tiling()
  stream_max_q: int | None = None  # default QMATMUL_STREAM_MAX_Q

  def __post_init__(self):
    if self.stream_max_q is not None and self.stream_max_q < 0:
      raise ValueError(f"stream_max_q must be >= 0, got {self.stream_max_q}")


def _kernels(implementation: "str | Kernels | None") -> str:
  if isinstance(implementation, Kernels):
    implementation = implementation.name
  return resolve_implementation(implementation)


def _tiling(implementation) -> attention_api.Tiling:
  if isinstance(implementation, Kernels):
    return implementation.attention
  return attention_api.Tiling()


def rope_and_write(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
                   k_cache_BxSxKxD, v_cache_BxSxKxD, *, theta: float,
                   scale: float, rope_fn, implementation: str | None = None):
  """RoPE q and k, scale q, write k and v into the caches at `slots_BxQ`.

  Returns (q_BxQxHxD rotated and scaled, k_cache, v_cache). The kernel fuses
  all of it and writes in place (donate the caches); it rotates in float32.
  The reference path applies the model's own `rope_fn(x, positions)`, which
  keeps Dream's bf16 rotation bit-faithful.
  """
  impl = _kernels(implementation)
  if impl != "reference":
    kernel = lambda *args: cache_api.rope_write(
        *args, theta=theta, scale=scale, implementation=impl)
    mesh = parallel.active_mesh()
    if mesh is not None:
      heads, rows = parallel.HEADS_SPEC, P("data")
      kernel = parallel.shard_map(kernel, mesh,
                                  (heads, heads, heads, rows, rows, heads,
                                   heads), (heads, heads, heads))
    return kernel(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
                  k_cache_BxSxKxD, v_cache_BxSxKxD)
  q = rope_fn(q_BxQxHxD, positions_BxQ)
  q = (q.astype(jnp.float32) * scale).astype(q_BxQxHxD.dtype)
  k = rope_fn(k_BxQxKxD, positions_BxQ)
  return (q, write_cache(k_cache_BxSxKxD, k, slots_BxQ),
          write_cache(v_cache_BxSxKxD, v_BxQxKxD, slots_BxQ))


def cached_attention(q_BxQxHxD: jax.Array, k_cache_BxSxKxD: jax.Array,
                     v_cache_BxSxKxD: jax.Array, key_valid_BxS: jax.Array, *,
                     exclude_BxS: jax.Array | None = None,
                     k_new_BxQxKxD: jax.Array | None = None,
                     v_new_BxQxKxD: jax.Array | None = None,
                     inq_mask_BxQxQ: jax.Array | None = None,
                     mass_rows_BxQ: jax.Array | None = None,
                     mass_prefix: int | None = None,
                     mass_score: str = "mass",
                     implementation: str | None = None):
  """Pre-scaled queries over the valid, non-excluded cache slots, plus their
  own fresh keys where inq_mask_BxQxQ allows, in one softmax.

  Returns (o_BxQxHxD, mass_BxS or None): mass sums, over heads and the rows
  in mass_rows_BxQ, the probability each cache slot receives. The kernel reads
  the cache in place and accumulates the mass without materialising scores;
  the reference materialises them. mass_prefix: mass rows are among the
  first mass_prefix queries (later ones are ignored), which lets the kernel
  score those rows alone. mass_score "logit" sums the pre-softmax scaled q.k
  per slot instead of probabilities (Flash-dLLM's ranking of decoded tokens).

  Under a mesh the kernel runs per shard (rows on "data", heads on "model")
  with the key splits one device would pick, and the mass of every KV head
  is gathered over "model" before one fixed-order sum over heads: the same
  bits on every mesh.
  """
  impl = _kernels(implementation)
  b, q = q_BxQxHxD.shape[:2]
  s = k_cache_BxSxKxD.shape[1]
  exclude = ~key_valid_BxS
  if exclude_BxS is not None:
    exclude = exclude | exclude_BxS
  heads, rows = parallel.HEADS_SPEC, P("data")
  named = dict(q_BxQxHxD=(q_BxQxHxD, heads),
               k_cache_BxSxKxD=(k_cache_BxSxKxD, heads),
               v_cache_BxSxKxD=(v_cache_BxSxKxD, heads),
               k_len_B=(jnp.full((b,), s, jnp.int32), rows),
               q_len_B=(jnp.full((b,), q, jnp.int32), rows),
               k_new_BxIxKxD=(k_new_BxQxKxD, heads),
               v_new_BxIxKxD=(v_new_BxQxKxD, heads),
               inq_mask_BxQxI=(inq_mask_BxQxQ, rows),
               exclude_BxS=(exclude, rows),
               score_rows_BxQ=(mass_rows_BxQ, rows))
  named = {k: v for k, v in named.items() if v[0] is not None}
  mesh = parallel.active_mesh() if impl != "reference" else None
  tiling = _tiling(implementation)
  splits = attention_api.splits_for(q_BxQxHxD.shape, k_cache_BxSxKxD.shape,
                                    tiling=tiling)

  def attend(*arrays):
    out, mass_BxKxS = attention_api.scheduled_attention(
        scale=1.0, implementation=impl, head_mass=True, num_splits=splits,
        score_prefix=mass_prefix, score=mass_score,
        tiling=tiling,
        **dict(zip(named, arrays)))
    if mass_BxKxS is not None and mesh is not None:  # this shard's heads
      mass_BxKxS = jax.lax.all_gather(mass_BxKxS, "model", axis=1, tiled=True)
    return out, mass_BxKxS

  if mesh is not None:
    attend = parallel.shard_map(
        attend, mesh, tuple(spec for _, spec in named.values()),
        (heads, rows if mass_rows_BxQ is not None else None))
  out_BxQxHxD, mass_BxKxS = attend(*(x for x, _ in named.values()))
  if mass_BxKxS is None:
    return out_BxQxHxD, None
  if impl == "reference":  # partitioned by XLA, which would split a sum
    # over sharded heads into per-device sums + all-reduce: computed per
    # head on the head shards, then gathered.
    mass_BxKxS = parallel.constrain(
        parallel.constrain(mass_BxKxS, P("data", "model")), rows)
  return out_BxQxHxD, attention_api.sum_heads(mass_BxKxS)


def token_logprob(logits_BxRxV: jax.Array, tokens_BxR: jax.Array, *,
                  implementation: str | None = None) -> jax.Array:
  """[B, R] float32 log softmax(logits)[token]: what confidences, sampler
  thresholds and verify acceptances are made of.

  On a GPU the kernel, whose sum over the vocabulary runs in one order
  whatever the number of rows (XLA's order changed with it, which flipped
  near-threshold commits between batch sizes); per data shard under a mesh.
  """
  impl = _kernels(implementation)
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
