"""The LLaDA / Dream transformer: bidirectional, pre-norm, SwiGLU, RoPE, GQA.

One forward runs any subset of positions (`Q` query tokens per row). Without a
cache the queries attend to each other; with a `KVCache`, their fresh keys and
values are first written into their slots and the queries then attend over the
whole cache, so callers choose which positions to recompute each step.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax import ops, quantize
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import fuse
from flash_dllm_jax.model.cache import KVCache
from flash_dllm_jax.model.layers import (Linear, QuantizedEmbed, RMSNorm,
                                         apply_rope, embed_lookup, rope_angles)


@struct.dataclass
class CachedExtras:
  """Options of a cached forward beyond "write my K/V, attend to the cache".

  write_cache: False runs the queries without writing their K/V (a verify
    pass); they then see each other only where inq_mask_BxQxQ allows.
  exclude_BxS: cache slots hidden from every query (e.g. the slots the
    queries themselves re-encode).
  mass_rows_BxQ: query rows whose attention probabilities, summed over heads,
    are accumulated per key into the "attention_mass" intermediate.
  mass_prefix: mass rows lie among the first mass_prefix queries (later ones
    are ignored), so the kernel can score those rows alone.
  mass_score: "mass" accumulates softmax probabilities, "logit" the scaled
    pre-softmax q.k (summed the same way).
  """

  write_cache: bool = struct.field(pytree_node=False, default=True)
  exclude_BxS: jax.Array | None = None
  inq_mask_BxQxQ: jax.Array | None = None
  mass_rows_BxQ: jax.Array | None = None
  mass_prefix: int | None = struct.field(pytree_node=False, default=None)
  mass_score: str = struct.field(pytree_node=False, default="mass")


class Block(nn.Module):
  """x += attn_out(attn(attn_norm(x))); x += down(silu(gate(n)) * up(n))."""

  config: ModelConfig
  param_dtype: jnp.dtype
  implementation: str | None = None
  sow_mass: bool = False

  @nn.compact
  def __call__(self, x_BxQxE, positions_BxQ, cos_BxQxD, sin_BxQxD,
               key_valid_BxS, cache_kv=None, slots_BxQ=None, extras=None):
    cfg = self.config
    b, q, _ = x_BxQxE.shape
    h, k, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    # Tensor parallelism shards every kernel by output columns; the two
    # back to the residual stream gather their input and output (ops.linear).
    dense = lambda n, f, bias=False, gathered=False: Linear(
        f, use_bias=bias, gathered=gathered, name=n,
        param_dtype=self.param_dtype, quantize=cfg.quantize,
        implementation=self.implementation)

    n_BxQxE = RMSNorm(cfg.rms_norm_eps, self.param_dtype, self.implementation,
                      name="attn_norm")(x_BxQxE)
    if cfg.fused_qkv:
      q_BxQxHxD, k_BxQxKxD, v_BxQxKxD = fuse.split_qkv(dense(
          "qkv_proj", fuse.qkv_features(cfg), cfg.qkv_bias)(n_BxQxE), cfg)
    else:
      q_BxQxHxD = dense("q_proj", h * d, cfg.qkv_bias)(n_BxQxE).reshape(
          b, q, h, d)
      k_BxQxKxD = dense("k_proj", k * d, cfg.qkv_bias)(n_BxQxE).reshape(
          b, q, k, d)
      v_BxQxKxD = dense("v_proj", k * d, cfg.qkv_bias)(n_BxQxE).reshape(
          b, q, k, d)
    rope = lambda x, _: apply_rope(x, cos_BxQxD, sin_BxQxD, cfg.rope_in_float32)
    scale = 1.0 / math.sqrt(d)
    new_kv = None
    if cache_kv is None:
      o_BxQxHxD = ops.attention(rope(q_BxQxHxD, None), rope(k_BxQxKxD, None),
                                v_BxQxKxD, key_valid_BxS, scale=scale,
                                implementation=self.implementation)
    else:
      extras = extras or CachedExtras()
      if extras.write_cache:
        q_BxQxHxD, keys_BxSxKxD, values_BxSxKxD = ops.rope_and_write(
            q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
            cache_kv[0], cache_kv[1], theta=cfg.rope_theta, scale=scale,
            rope_fn=rope, implementation=self.implementation)
        new_kv = (keys_BxSxKxD, values_BxSxKxD)
        k_new_BxQxKxD = v_new_BxQxKxD = None
      else:  # the queries see each other only through extras.inq_mask
        q_BxQxHxD = (rope(q_BxQxHxD, None).astype(jnp.float32) * scale
                     ).astype(q_BxQxHxD.dtype)
        keys_BxSxKxD, values_BxSxKxD = cache_kv
        k_new_BxQxKxD, v_new_BxQxKxD = rope(k_BxQxKxD, None), v_BxQxKxD
        new_kv = cache_kv
      o_BxQxHxD, mass_BxS = ops.cached_attention(
          q_BxQxHxD, keys_BxSxKxD, values_BxSxKxD, key_valid_BxS,
          exclude_BxS=extras.exclude_BxS, k_new_BxQxKxD=k_new_BxQxKxD,
          v_new_BxQxKxD=v_new_BxQxKxD, inq_mask_BxQxQ=extras.inq_mask_BxQxQ,
          mass_rows_BxQ=extras.mass_rows_BxQ if self.sow_mass else None,
          mass_prefix=extras.mass_prefix, mass_score=extras.mass_score,
          implementation=self.implementation)
      if mass_BxS is not None:
        self.sow("intermediates", "attention_mass", mass_BxS)
    o_BxQxHD = o_BxQxHxD.reshape(b, q, h * d)
    if cfg.quantize is not None:
      return self._quantized_tail(x_BxQxE, o_BxQxHD, dense), new_kv
    x_BxQxE = x_BxQxE + dense("attn_out", cfg.d_model, gathered=True)(
        o_BxQxHD)

    n_BxQxE = RMSNorm(cfg.rms_norm_eps, self.param_dtype, self.implementation,
                      name="mlp_norm")(x_BxQxE)
    gate_BxQxF = dense("gate_proj", cfg.mlp_hidden)(n_BxQxE)
    up_BxQxF = dense("up_proj", cfg.mlp_hidden)(n_BxQxE)
    x_BxQxE = x_BxQxE + dense("down_proj", cfg.d_model, gathered=True)(
        nn.silu(gate_BxQxF) * up_BxQxF)
    return x_BxQxE, new_kv

  def _quantized_tail(self, x_BxQxE, o_BxQxHD, dense):
    """attn_out and the MLP with 8-bit weights, through the fused epilogues
    of ops.quantized_linear: the residual added to attn_out's and down's
    float32 sums, silu(gate) * up from gate's and up's."""
    cfg = self.config
    fmt, impl = cfg.quantize, self.implementation
    w, s, _ = dense("attn_out", cfg.d_model)(o_BxQxHD, weights_only=True)
    x_BxQxE = ops.quantized_linear(o_BxQxHD, w, s, fmt=fmt, gathered=True,
                                   residual_BxQxO=x_BxQxE,
                                   implementation=impl)
    n_BxQxE = RMSNorm(cfg.rms_norm_eps, self.param_dtype, impl,
                      name="mlp_norm")(x_BxQxE)
    w_gate, s_gate, _ = dense("gate_proj", cfg.mlp_hidden)(
        n_BxQxE, weights_only=True)
    w_up, s_up, _ = dense("up_proj", cfg.mlp_hidden)(n_BxQxE,
                                                     weights_only=True)
    h_BxQxF = ops.quantized_linear(n_BxQxE, w_gate, s_gate, fmt=fmt,
                                   up=(w_up, s_up), implementation=impl)
    w, s, _ = dense("down_proj", cfg.d_model)(h_BxQxF, weights_only=True)
    return ops.quantized_linear(h_BxQxF, w, s, fmt=fmt, gathered=True,
                                residual_BxQxO=x_BxQxE, implementation=impl)


class Transformer(nn.Module):
  """Token ids -> vocabulary logits for the requested rows.

  Call arguments:
    tokens_BxQ: ids of the query tokens.
    positions_BxQ: their RoPE positions.
    key_valid_BxS: which keys may be attended to (S = Q without a cache,
      S = cache length with one).
    cache: optional KVCache; the queries' K/V are written at `slots_BxQ`
      (-1 skips a row) before attending over the whole cache.
    logit_rows_BxR: indices into Q of the rows whose logits are wanted; the
      vocabulary head runs only on these (all rows if None).
    extras: CachedExtras for verify passes and attention mass; layers from
      `mass_from_layer` on sow their mass (apply with
      mutable=["intermediates"] to read it).
  Returns (logits_BxRxV in float32, updated cache or None).
  """

  config: ModelConfig
  param_dtype: jnp.dtype = jnp.bfloat16
  head_init_scale: float = 1.0
  implementation: str | None = None  # kernels: see flash_dllm_jax/ops/

  @nn.compact
  def __call__(self, tokens_BxQ, positions_BxQ, key_valid_BxS, cache=None,
               slots_BxQ=None, logit_rows_BxR=None, extras=None,
               mass_from_layer=0):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    if cfg.quantize_embedding:  # {'kernel_q': [V, E], 'scale': [V, 1]}
      embed = QuantizedEmbed(cfg.vocab_size, cfg.d_model, head_format(cfg),
                             name="embed")()
    else:
      embed = self.param("embed", nn.initializers.normal(1.0),
                         (cfg.vocab_size, cfg.d_model), self.param_dtype)
    x_BxQxE = embed_lookup(embed, tokens_BxQ, dtype)
    cos_BxQxD, sin_BxQxD = rope_angles(positions_BxQ, cfg.head_dim,
                                       cfg.rope_theta)
    if cache is not None and slots_BxQ is None:
      raise ValueError("a cached forward needs slots_BxQ")
    new_k, new_v = [], []
    for layer in range(cfg.n_layers):
      kv = None if cache is None else (cache.k[layer], cache.v[layer])
      x_BxQxE, kv = Block(cfg, self.param_dtype, self.implementation,
                          sow_mass=layer >= mass_from_layer,
                          name=f"layers_{layer}")(
          x_BxQxE, positions_BxQ, cos_BxQxD, sin_BxQxD, key_valid_BxS, kv,
          slots_BxQ, extras)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    if logit_rows_BxR is not None:
      x_BxQxE = jnp.take_along_axis(x_BxQxE, logit_rows_BxR[..., None], axis=1)
    x_BxQxE = RMSNorm(cfg.rms_norm_eps, self.param_dtype, self.implementation,
                      name="final_norm")(x_BxQxE)
    if cfg.quantize_head:
      logits = vocab_head(cfg, Linear(
          cfg.vocab_size, quantize=head_format(cfg), name="lm_head")(
              x_BxQxE, weights_only=True), x_BxQxE, self.implementation)
    else:
      head_init = nn.initializers.normal(self.head_init_scale / math.sqrt(
          cfg.d_model))
      head_ExV = self.param("lm_head", head_init,
                            (cfg.d_model, cfg.vocab_size), self.param_dtype)
      logits = vocab_head(cfg, head_ExV, x_BxQxE, self.implementation)
    new_cache = None if cache is None else KVCache(tuple(new_k), tuple(new_v))
    return logits, new_cache


def head_format(config: ModelConfig) -> str:
  """The 8-bit format of a quantized LM head and embedding
  (quantize.Format.head_format)."""
  return quantize.get_format(config.quantize).head_format


def vocab_head(config: ModelConfig, head, x_BxRxE: jax.Array,
               implementation=None) -> jax.Array:
  """logits_BxRxV in float32 of the final-normed rows: head is lm_head
  [E, V], or (kernel_q [V, E], scale [V, Z], None) when it is quantized
  (then x enters in float32 and the logits leave in float32)."""
  if not config.quantize_head:
    return jnp.einsum("bre,ev->brv", x_BxRxE,
                      head.astype(jnp.dtype(config.dtype)),
                      preferred_element_type=jnp.float32)
  w_VxE, scale_VxZ = head[0], head[1]
  return ops.quantized_linear(x_BxRxE.astype(jnp.float32), w_VxE, scale_VxZ,
                              fmt=head_format(config), gathered=True,
                              implementation=implementation)


def init_params(config: ModelConfig, rng: jax.Array,
                param_dtype=None, head_init_scale: float = 1.0):
  """Random parameters (N(0, 1/fan_in) kernels, unit embeddings) for tests and
  benchmarks; a pure function of `rng`, jitted so large models init on device.
  A quantized config gets the unquantized tree's weights quantized.
  """
  if config.quantize is not None:
    params = init_params(config.replace(quantize=None, quantize_head=False,
                                        quantize_embedding=False),
                         rng, param_dtype, head_init_scale)
    return quantize.quantize_params(params, config.quantize,
                                    head=config.quantize_head,
                                    embedding=config.quantize_embedding)
  param_dtype = jnp.dtype(param_dtype or config.dtype)
  model = Transformer(config, param_dtype, head_init_scale)
  tokens = jnp.zeros((1, 1), jnp.int32)
  init = jax.jit(lambda r: model.init(r, tokens, tokens,
                                      jnp.ones((1, 1), bool))["params"])
  return init(rng)
