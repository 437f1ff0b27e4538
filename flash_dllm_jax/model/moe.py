"""Mixture of experts: a float32 router choosing top-k experts per token
within the best groups, routed experts for the chosen (token, slot)
pairs, shared experts for every token.

Shapes: T tokens (B * Q rows), X experts, K experts per token, G groups,
E model width, M an expert's width. The routed experts run as dense
products of every row with every expert (C experts at a time), each pair
then taking its expert's row: each element is one dot product over one
row and one expert's column, so a token's output depends on its row and
the weights alone, whatever the rows, experts or devices beside it, as
far as the GEMM's rows and columns do not depend on their neighbours
(what the tensor-parallel projections need too: parallel.py).
jax.lax.ragged_dot over pairs sorted by expert is no sparser here: XLA:CPU
(and XLA:GPU for float32 output) lower it to these masked products for
every pair, K times the work, in one dot summing over groups x inputs,
whose order changed with the group and row counts.
Under a mesh each device holds X / M experts (routed_experts).
`dense_reference` is the plain float32 reference the layer is tested
against.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel, quantize
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import roles
from flash_dllm_jax.model.layers import Linear
from flash_dllm_jax.model.mlp import swiglu


def route(moe, logits_TxX: jax.Array, bias_X: jax.Array | None):
  """(expert ids [T, K] int32, weights [T, K] float32) from float32 router
  logits: sigmoid (or softmax) scores, the bias added for the choice only,
  the choice limited to the topk_groups groups whose two best biased
  scores sum highest, weights normalised over the K (norm_topk) and
  scaled by routed_scaling."""
  t, x = logits_TxX.shape
  scores_TxX = (jax.nn.sigmoid(logits_TxX) if moe.score == "sigmoid"
                else jax.nn.softmax(logits_TxX, axis=-1))
  choice_TxX = scores_TxX if bias_X is None else scores_TxX + bias_X
  if moe.n_groups > 1:
    per_group = choice_TxX.reshape(t, moe.n_groups, x // moe.n_groups)
    best = min(2, x // moe.n_groups)
    group_TxG = jnp.sum(jax.lax.top_k(per_group, best)[0], axis=-1)
    _, groups_TxT = jax.lax.top_k(group_TxG, moe.topk_groups)
    keep_TxG = jnp.zeros((t, moe.n_groups), bool).at[
        jnp.arange(t)[:, None], groups_TxT].set(True)
    keep_TxX = jnp.repeat(keep_TxG, x // moe.n_groups, axis=1)
    choice_TxX = jnp.where(keep_TxX, choice_TxX, -jnp.inf)
  _, ids_TxK = jax.lax.top_k(choice_TxX, moe.top_k)
  weights_TxK = jnp.take_along_axis(scores_TxX, ids_TxK, axis=1)
  if moe.norm_topk and moe.top_k > 1:
    weights_TxK = weights_TxK / (jnp.sum(weights_TxK, -1, keepdims=True)
                                 + 1e-20)
  return ids_TxK.astype(jnp.int32), weights_TxK * moe.routed_scaling


class ExpertStack(nn.Module):
  """One projection of every expert, its stacked weights as stored:
  (kernel [X, in, out],) or, 8-bit, (kernel_q [X, out, in], scale
  [X, out, Z]); `expert_mlp` applies them."""

  n_experts: int
  features: int
  param_dtype: jnp.dtype = jnp.float32
  quantize: str | None = None

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, ...]:
    roles.declare(self, "kernel", roles.Role("experts", "projection"))
    x, i, o = self.n_experts, in_features, self.features
    if self.quantize is None:
      return (self.param("kernel", nn.initializers.variance_scaling(
          1.0, "fan_in", "normal", in_axis=1, out_axis=2), (x, i, o),
          self.param_dtype),)
    fmt = quantize.get_format(self.quantize)
    z = quantize.scale_columns(self.quantize, i)
    return (self.param("kernel_q", nn.initializers.zeros, (x, o, i),
                       fmt.dtype),
            self.param("scale", nn.initializers.ones, (x, o, z), jnp.float32))


def stack_weight(stack: tuple[jax.Array, ...], dtype) -> jax.Array:
  """[X, in, out] in `dtype`: one ExpertStack's arrays (8-bit ones
  dequantized per element, w * scale exactly)."""
  if len(stack) == 1:
    return stack[0].astype(dtype)
  kernel_q, scale = stack
  x, o, i = kernel_q.shape
  w_XxOxI = (kernel_q.astype(jnp.float32).reshape(x, o, scale.shape[-1], -1)
             * scale[..., None]).reshape(x, o, i)
  return jnp.swapaxes(w_XxOxI, 1, 2).astype(dtype)


def expert_mlp(x_TxE: jax.Array, gate, up, down) -> jax.Array:
  """y [T, X, E] in x's dtype: every expert of the stacks (X of them) on
  every row, (silu(x Wg) * x Wu) Wd, each product accumulated in float32.

  Each element is one dot product over one row and one expert's column
  (a GEMM over [X * M] columns, then a batch over X of [T, M] x [M, E]),
  so a device holding some of the experts computes their elements as one
  device does."""
  def dot(spec, a, stack, upcast=False):
    w = stack_weight(stack, a.dtype)
    if upcast:  # exact: a bf16 value is a float32 value
      a, w = a.astype(jnp.float32), w.astype(jnp.float32)
    return jnp.einsum(spec, a, w, preferred_element_type=jnp.float32
                      ).astype(x_TxE.dtype)

  h_TxXxM = (nn.silu(dot("te,xem->txm", x_TxE, gate))
             * dot("te,xem->txm", x_TxE, up))
  # XLA:CPU has no batched bf16 x bf16 -> float32 dot.
  return dot("txm,xme->txe", h_TxXxM, down,
             upcast=jax.default_backend() == "cpu")


class SharedExperts(nn.Module):
  """The shared experts: one SwiGLU MLP of width n_shared * M."""

  config: ModelConfig
  param_dtype: jnp.dtype
  implementation: str | None = None

  @nn.compact
  def __call__(self, n_BxQxE: jax.Array) -> jax.Array:
    cfg = self.config
    dense = lambda n, f, gathered=False: Linear(
        f, gathered=gathered, name=n, param_dtype=self.param_dtype,
        quantize=cfg.quantize, implementation=self.implementation)
    return swiglu(cfg, dense, n_BxQxE, cfg.moe.n_shared * cfg.moe.hidden,
                  None, self.implementation)


class MoE(nn.Module):
  """residual + routed experts + shared experts of the normed input."""

  config: ModelConfig
  param_dtype: jnp.dtype
  implementation: str | None = None

  @nn.compact
  def __call__(self, n_BxQxE: jax.Array, residual_BxQxE: jax.Array):
    cfg, moe = self.config, self.config.moe
    b, q, e = n_BxQxE.shape
    router = self.param("router", nn.initializers.normal(0.02),
                        (e, moe.n_experts), self.param_dtype)
    roles.declare(self, "router", roles.Role(float32=True))
    bias = None
    if moe.expert_bias:
      bias = self.param("expert_bias", nn.initializers.zeros,
                        (moe.n_experts,), jnp.float32)
      roles.declare(self, "expert_bias", roles.Role(float32=True))
    n_TxE = n_BxQxE.reshape(b * q, e)
    logits_TxX = jnp.dot(n_TxE.astype(jnp.float32),
                         router.astype(jnp.float32),
                         precision=jax.lax.Precision.HIGHEST)
    ids_TxK, weights_TxK = route_rows(moe, logits_TxX, bias)
    stack = lambda name, i, o: ExpertStack(
        moe.n_experts, o, self.param_dtype, cfg.quantize, name=name)(i)
    stacks = (stack("experts_gate", e, moe.hidden),
              stack("experts_up", e, moe.hidden),
              stack("experts_down", moe.hidden, e))
    y_TxKxE = routed_experts(n_TxE, ids_TxK, stacks)
    out_TxE = jnp.einsum("tk,tke->te", weights_TxK,
                         y_TxKxE.astype(jnp.float32))
    if moe.n_shared:
      shared = SharedExperts(cfg, self.param_dtype, self.implementation,
                             name="shared")(n_BxQxE)
      out_TxE = out_TxE + shared.reshape(b * q, e).astype(jnp.float32)
    return residual_BxQxE + out_TxE.reshape(b, q, e).astype(n_BxQxE.dtype)


def route_rows(moe, logits_TxX: jax.Array, bias_X: jax.Array | None):
  """`route` per device under a mesh (its rows on "data", every "model"
  device the same choice): left to XLA, the top-k and the group mask were
  split across devices and gathered back whole."""
  mesh = parallel.active_mesh()
  if mesh is None:
    return route(moe, logits_TxX, bias_X)
  if bias_X is None:
    return parallel.shard_map(lambda l: route(moe, l, None), mesh,
                              (P("data"),), (P("data"), P("data")))(logits_TxX)
  return parallel.shard_map(lambda l, b: route(moe, l, b), mesh,
                            (P("data"), P()), (P("data"), P("data")))(
                                logits_TxX, bias_X)


def routed_experts(x_TxE: jax.Array, ids_TxK: jax.Array, stacks
                   ) -> jax.Array:
  """y [T, K, E]: each token's K chosen experts (stacks: the gate, up and
  down ExpertStack arrays) on its row.

  Under a mesh the experts are split over "model" (the stacks' leading
  axis) and the rows over "data": each device runs its own experts on its
  rows, keeps the (token, slot) pairs routed to them and sets the others
  to -0.0, and a psum over "model" gives each pair its one device's value
  (v + -0.0 is v in IEEE arithmetic, signed zeros included): one device's
  bits, with no expert weight leaving its device."""
  mesh = parallel.active_mesh()
  if mesh is None:
    return local_experts(x_TxE, ids_TxK, 0, stacks)
  split = mesh.shape["model"] > 1

  def shard(x_TxE, ids_TxK, stacks):
    first = jax.lax.axis_index("model") * stacks[0][0].shape[0]
    y_TxKxE = local_experts(x_TxE, ids_TxK, first, stacks, others=split)
    return jax.lax.psum(y_TxKxE, "model") if split else y_TxKxE

  experts = jax.tree.map(lambda _: P("model", None, None), stacks)
  return parallel.shard_map(shard, mesh, (P("data"), P("data"), experts),
                            P("data"))(x_TxE, ids_TxK, stacks)


# The most bytes of one chunk's [T, C, E] expert outputs (float32 sized):
# more experts than fit run C at a time in a loop.
EXPERT_CHUNK_BYTES = 1 << 28


def local_experts(x_TxE: jax.Array, ids_TxK: jax.Array, first, stacks,
                  others: bool = False) -> jax.Array:
  """y [T, K, E] of the pairs whose expert is one of those `stacks` hold
  (X' of them, experts first .. first + X' - 1), C experts at a time; with
  others (pairs may have other experts) the other pairs are -0.0."""
  (t, e), k = x_TxE.shape, ids_TxK.shape[1]
  n_local = stacks[0][0].shape[0]
  c = max([d for d in range(1, n_local + 1) if n_local % d == 0
           and t * d * e * 4 <= EXPERT_CHUNK_BYTES] or [1])
  local_TxK = ids_TxK - first

  def chunk(c0, stacks):
    """The pairs' outputs through experts c0 .. c0 + c - 1 (others: any)."""
    y_TxCxE = expert_mlp(x_TxE, *stacks)
    return jnp.take_along_axis(
        y_TxCxE, jnp.clip(local_TxK - c0, 0, c - 1)[..., None], axis=1)

  if c == n_local:
    y_TxKxE = chunk(0, stacks)
  else:
    def step(y_TxKxE, chunk_args):
      c0, stacks = chunk_args
      inside_TxK = (local_TxK >= c0) & (local_TxK < c0 + c)
      return jnp.where(inside_TxK[..., None], chunk(c0, stacks), y_TxKxE), None

    chunks = jax.tree.map(
        lambda a: a.reshape(n_local // c, c, *a.shape[1:]), stacks)
    y_TxKxE, _ = jax.lax.scan(step, jnp.zeros((t, k, e), x_TxE.dtype),
                              (jnp.arange(0, n_local, c), chunks))
  if not others:
    return y_TxKxE
  mine_TxK = (local_TxK >= 0) & (local_TxK < n_local)
  return jnp.where(mine_TxK[..., None], y_TxKxE,
                   jnp.asarray(-0.0, y_TxKxE.dtype))


def dense_reference(params, config: ModelConfig, n_BxQxE: jax.Array
                    ) -> jax.Array:
  """The routed + shared experts' sum [B, Q, E] in float32 with every
  expert run on every token (unquantized params of one MoE layer): the
  plain reference of MoE's routed and shared experts."""
  moe = config.moe
  b, q, e = n_BxQxE.shape
  x_TxE = n_BxQxE.reshape(b * q, e).astype(jnp.float32)
  hi = jax.lax.Precision.HIGHEST
  logits_TxX = jnp.dot(x_TxE, params["router"].astype(jnp.float32),
                       precision=hi)
  ids_TxK, weights_TxK = route(moe, logits_TxX, params.get("expert_bias"))
  w = lambda n: params[n]["kernel"].astype(jnp.float32)
  h_TxXxM = jax.nn.silu(jnp.einsum("te,xem->txm", x_TxE, w("experts_gate"),
                                   precision=hi)) * jnp.einsum(
      "te,xem->txm", x_TxE, w("experts_up"), precision=hi)
  y_TxXxE = jnp.einsum("txm,xme->txe", h_TxXxM, w("experts_down"),
                       precision=hi)
  out_TxE = jnp.einsum("tk,tke->te", weights_TxK,
                       jnp.take_along_axis(y_TxXxE, ids_TxK[..., None], 1))
  if moe.n_shared:
    s = lambda n: params["shared"][n]["kernel"].astype(jnp.float32)
    h_TxS = jax.nn.silu(x_TxE @ s("gate_proj")) * (x_TxE @ s("up_proj"))
    out_TxE = out_TxE + h_TxS @ s("down_proj")
  return out_TxE.reshape(b, q, e)

