"""Mixture of experts: a float32 router choosing top-k experts per token
within the best groups, the chosen experts only (jax.lax.ragged_dot over
tokens sorted by expert), shared experts for every token.

Shapes: T tokens (B * Q rows), X experts, K experts per token, G groups,
E model width, M an expert's width. `dense_reference` computes every
expert for every token, the plain reference the sparse path is tested
against. A token's output depends on its own row and the weights alone:
sorting only moves rows, and each sorted row's products are its own.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flash_dllm_jax import quantize
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
  """One projection of every expert: kernel [X, in, out] (8-bit: kernel_q
  [X, out, in] and scale [X, out, Z]), applied to rows sorted by expert
  with `group_sizes_X` rows each."""

  n_experts: int
  features: int
  param_dtype: jnp.dtype = jnp.float32
  quantize: str | None = None

  @nn.compact
  def __call__(self, x_NxI: jax.Array, group_sizes_X: jax.Array
               ) -> jax.Array:
    roles.declare(self, "kernel", roles.Role("experts", "projection"))
    x, i, o = self.n_experts, x_NxI.shape[-1], self.features
    dot = lambda w_XxIxO: jax.lax.ragged_dot(
        x_NxI, w_XxIxO.astype(x_NxI.dtype), group_sizes_X,
        preferred_element_type=jnp.float32)
    if self.quantize is None:
      kernel = self.param("kernel", nn.initializers.variance_scaling(
          1.0, "fan_in", "normal", in_axis=1, out_axis=2), (x, i, o),
          self.param_dtype)
      return dot(kernel).astype(x_NxI.dtype)
    fmt = quantize.get_format(self.quantize)
    z = quantize.scale_columns(self.quantize, i)
    kernel_q = self.param("kernel_q", nn.initializers.zeros, (x, o, i),
                          fmt.dtype)
    scale = self.param("scale", nn.initializers.ones, (x, o, z), jnp.float32)
    w_XxOxI = (kernel_q.astype(jnp.float32).reshape(x, o, z, i // z)
               * scale[..., None]).reshape(x, o, i)
    return dot(jnp.swapaxes(w_XxOxI, 1, 2)).astype(x_NxI.dtype)


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
    ids_TxK, weights_TxK = route(moe, logits_TxX, bias)
    stack = lambda name, f: ExpertStack(moe.n_experts, f, self.param_dtype,
                                        cfg.quantize, name=name)
    y_TxKxE = sparse_experts(
        n_TxE, ids_TxK, moe.n_experts,
        lambda x, g: stack("experts_down", e)(
            nn.silu(stack("experts_gate", moe.hidden)(x, g))
            * stack("experts_up", moe.hidden)(x, g), g))
    out_TxE = jnp.einsum("tk,tke->te", weights_TxK,
                         y_TxKxE.astype(jnp.float32))
    if moe.n_shared:
      shared = SharedExperts(cfg, self.param_dtype, self.implementation,
                             name="shared")(n_BxQxE)
      out_TxE = out_TxE + shared.reshape(b * q, e).astype(jnp.float32)
    return residual_BxQxE + out_TxE.reshape(b, q, e).astype(n_BxQxE.dtype)


def sparse_experts(x_TxE: jax.Array, ids_TxK: jax.Array, n_experts: int,
                   experts) -> jax.Array:
  """y [T, K, E]: experts(rows sorted by expert, group sizes [X]) on each
  token's K chosen experts, back in token order."""
  t, k = ids_TxK.shape
  flat_N = ids_TxK.reshape(-1)
  order_N = jnp.argsort(flat_N, stable=True)
  sizes_X = jnp.zeros((n_experts,), jnp.int32).at[flat_N].add(1)
  y_NxE = experts(x_TxE[order_N // k], sizes_X)
  y_NxE = jnp.zeros_like(y_NxE).at[order_N].set(y_NxE)
  return y_NxE.reshape(t, k, -1)


def dense_reference(params, config: ModelConfig, n_BxQxE: jax.Array
                    ) -> jax.Array:
  """The routed + shared experts' sum [B, Q, E] in float32 with every
  expert run on every token (unquantized params of one MoE layer): the
  plain reference of MoE's sparse path."""
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

