"""Mixture of experts: a float32 router choosing top-k experts per token
within the best groups, routed experts for the chosen (token, slot)
pairs, shared experts for every token.

Shapes: T tokens (B * Q rows), X experts, K experts per token, G groups,
E model width, M an expert's width. The routed experts run through
ops.routed_experts, by backend:
- on a GPU, a grouped GEMM (pallas_kernels/grouped_matmul): the pairs
  sorted by expert and padded so each row tile of a fixed size is one
  expert's, gate and up fused, then down; K experts' FLOPs a token.
- elsewhere (and for implementation 'reference'), dense products of every
  row with every expert (C experts at a time), each pair then taking its
  expert's row: K / X of the work is used. XLA:CPU's products keep a
  row's bits whatever the rows and devices beside it at the row counts the
  tests use (the CPU's mesh tests check it bit for bit), but not at every
  count: below about 256 rows, or at an unaligned count, XLA:CPU may pick
  another product and move a row's last bits. The GPU kernel's invariance
  holds at every count.
Both aim at row invariance for the same reason: each output element is one
dot product over its row and its expert's column, summed in a fixed order
(the kernel's blocks of the input width, its tile shapes fixed whatever
the token count), so a token's output depends on its row and the weights
alone (what the tensor-parallel projections need too: parallel.py).
jax.lax.ragged_dot is no alternative: XLA lowers it to masked products for
every pair and every group, in one dot whose summation order changed with
the group and row counts.
Under a mesh each device holds X / M experts (routed_experts).
`dense_reference` is the plain float32 reference the layer is tested
against.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import ops, parallel, quantize, roles
from flash_dllm_jax.config import ModelConfig
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
  [X, out, Z]); ops.routed_experts applies them."""

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
    # Tokens per expert, for training's bias balancing (kept only when
    # applied with mutable=["intermediates"]).
    self.sow("intermediates", "expert_load", jnp.sum(
        jax.nn.one_hot(ids_TxK, moe.n_experts, dtype=jnp.float32), (0, 1)))
    stack = lambda name, i, o: ExpertStack(
        moe.n_experts, o, self.param_dtype, cfg.quantize, name=name)(i)
    stacks = (stack("experts_gate", e, moe.hidden),
              stack("experts_up", e, moe.hidden),
              stack("experts_down", moe.hidden, e))
    out_TxE = routed_sum(n_TxE, ids_TxK, weights_TxK, stacks,
                         self.implementation)
    if moe.n_shared:
      shared = SharedExperts(cfg, self.param_dtype, self.implementation,
                             name="shared")(n_BxQxE)
      out_TxE = out_TxE + shared.reshape(b * q, e).astype(jnp.float32)
    return residual_BxQxE + out_TxE.reshape(b, q, e).astype(n_BxQxE.dtype)


# Tokens whose routed experts run at once: a longer pass (a long prompt's
# prefill) runs them TOKEN_CHUNK tokens at a time, so its [T, K, E] pair
# buffers stay a chunk's. Each token's output depends on its row and the
# weights alone (see above), so the chunks change no bit.
TOKEN_CHUNK = 16384


def routed_sum(x_TxE, ids_TxK, weights_TxK, stacks, implementation=None,
               token_chunk: int | None = None) -> jax.Array:
  """out [T, E] float32: the weighted sum of each token's K routed experts,
  token_chunk (default TOKEN_CHUNK) tokens at a time past that many (on one
  device; under a mesh in one piece, its rows split over "data")."""
  def run(x_TxE, ids_TxK, weights_TxK):
    y_TxKxE = routed_experts(x_TxE, ids_TxK, stacks, implementation)
    return jnp.einsum("tk,tke->te", weights_TxK, y_TxKxE.astype(jnp.float32))

  t, c = x_TxE.shape[0], token_chunk or TOKEN_CHUNK
  if t <= c or parallel.active_mesh() is not None:
    return run(x_TxE, ids_TxK, weights_TxK)
  n = -(-t // c)
  chunks = lambda a: jnp.pad(a, [(0, n * c - t)] + [(0, 0)] * (a.ndim - 1)
                             ).reshape(n, c, *a.shape[1:])
  out_NxCxE = jax.lax.map(lambda a: run(*a), (
      chunks(x_TxE), chunks(ids_TxK), chunks(weights_TxK)))
  return out_NxCxE.reshape(n * c, -1)[:t]


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


def routed_experts(x_TxE: jax.Array, ids_TxK: jax.Array, stacks,
                   implementation=None) -> jax.Array:
  """y [T, K, E]: each token's K chosen experts (stacks: the gate, up and
  down ExpertStack arrays) on its row, through ops.routed_experts.

  Under a mesh the experts are split over "model" (the stacks' leading
  axis) and the rows over "data": each device runs its own experts on its
  rows, keeps the (token, slot) pairs routed to them and sets the others
  to -0.0, and a psum over "model" gives each pair its one device's value
  (v + -0.0 is v in IEEE arithmetic, signed zeros included): one device's
  bits, with no expert weight leaving its device."""
  mesh = parallel.active_mesh()
  if mesh is None:
    return ops.routed_experts(x_TxE, ids_TxK, 0, stacks,
                              implementation=implementation)
  split = mesh.shape["model"] > 1

  def shard(x_TxE, ids_TxK, stacks):
    first = jax.lax.axis_index("model") * stacks[0][0].shape[0]
    y_TxKxE = ops.routed_experts(x_TxE, ids_TxK, first, stacks,
                                 others=split, implementation=implementation)
    return jax.lax.psum(y_TxKxE, "model") if split else y_TxKxE

  experts = jax.tree.map(lambda _: P("model", None, None), stacks)
  return parallel.shard_map(shard, mesh, (P("data"), P("data"), experts),
                            P("data"))(x_TxE, ids_TxK, stacks)


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

