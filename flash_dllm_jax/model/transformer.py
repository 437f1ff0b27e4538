"""The transformer every architecture is made of: pre-norm blocks of an
attention part and a dense SwiGLU MLP or an MoE (model/attention.py,
mlp.py, moe.py), as the architecture spec and the config choose.

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

from flash_dllm_jax import ops, quantize, roles
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model.attention import CachedExtras, attend
from flash_dllm_jax.model.cache import KVCache
from flash_dllm_jax.model.layers import (Linear, QuantizedEmbed, RMSNorm,
                                         embed_lookup, rope_angles)
from flash_dllm_jax.model.mlp import residual_linear, swiglu
from flash_dllm_jax.model.moe import MoE

__all__ = ["Block", "CachedExtras", "Transformer", "init_params"]


class Block(nn.Module):
  """x += attn_out(attention(attn_norm(x))); x += mlp(mlp_norm(x)), the MLP
  dense or, in the config's MoE layers, a mixture of experts."""

  config: ModelConfig
  param_dtype: jnp.dtype
  implementation: str | None = None
  sow_mass: bool = False
  layer: int = 0

  @nn.compact
  def __call__(self, x_BxQxE, positions_BxQ, cos_BxQxR, sin_BxQxR,
               key_valid, cache_kv=None, slots_BxQ=None, extras=None):
    cfg, impl = self.config, self.implementation
    # Tensor parallelism shards every kernel by output columns; the two
    # back to the residual stream gather their input and output (ops.linear).
    dense = lambda n, f, bias=False, gathered=False: Linear(
        f, use_bias=bias, gathered=gathered, name=n,
        param_dtype=self.param_dtype, quantize=cfg.quantize,
        implementation=impl)
    norm = lambda name, x: RMSNorm(cfg.rms_norm_eps, self.param_dtype, impl,
                                   name=name)(x)
    o_BxQxHD, new_kv = attend(
        self, cfg, norm("attn_norm", x_BxQxE), positions_BxQ, cos_BxQxR,
        sin_BxQxR, key_valid, dense, cache_kv, slots_BxQ, extras)
    x_BxQxE = residual_linear(cfg, dense, "attn_out", cfg.d_model, o_BxQxHD,
                              x_BxQxE, impl)
    n_BxQxE = norm("mlp_norm", x_BxQxE)
    if cfg.is_moe_layer(self.layer):
      return MoE(cfg, self.param_dtype, impl, name="moe")(n_BxQxE,
                                                          x_BxQxE), new_kv
    return swiglu(cfg, dense, n_BxQxE, cfg.mlp_hidden, x_BxQxE,
                  impl), new_kv


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
    blocks_BxQ: for block-causal architectures, each position's decode
      block (uncached: a query sees the valid keys of its block and of
      earlier ones); None is one block (full attention). With a cache,
      key_blocks_BxS gives the cache slots' blocks, and the queries attend
      as the uncached forward's would (model/attention.py).
  Returns (logits_BxRxV in float32, updated cache or None).
  """

  config: ModelConfig
  param_dtype: jnp.dtype = jnp.bfloat16
  head_init_scale: float = 1.0
  implementation: str | None = None  # kernels: see flash_dllm_jax/ops/

  @nn.compact
  def __call__(self, tokens_BxQ, positions_BxQ, key_valid_BxS, cache=None,
               slots_BxQ=None, logit_rows_BxR=None, extras=None,
               mass_from_layer=0, blocks_BxQ=None, key_blocks_BxS=None,
               block_length=None):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    roles.declare(self, "embed", roles.Role("vocab_rows", "embedding"))
    roles.declare(self, "lm_head", roles.Role("replicated", "head"))
    if cfg.quantize_embedding:  # {'kernel_q': [V, E], 'scale': [V, 1]}
      embed = QuantizedEmbed(cfg.vocab_size, cfg.d_model, head_format(cfg),
                             name="embed")()
    else:
      embed = self.param("embed", nn.initializers.normal(1.0),
                         (cfg.vocab_size, cfg.d_model), self.param_dtype)
    x_BxQxE = embed_lookup(embed, tokens_BxQ, dtype)
    cos_BxQxR, sin_BxQxR = rope_angles(positions_BxQ, cfg.rope_dim,
                                       cfg.rope_theta)
    if cache is not None and slots_BxQ is None:
      raise ValueError("a cached forward needs slots_BxQ")
    key_valid = key_valid_BxS
    if blocks_BxQ is not None and cfg.spec.attention.mask == "block_causal":
      if cache is not None and key_blocks_BxS is None:
        raise ValueError("a cached block-causal forward needs key_blocks_BxS")
      rows_BxQ = None
      if (block_length is not None  # the kernel's block-by-block path
          and ops.choice.block_attention(self.implementation) == "split"):
        if cache is None:
          valid_BxQ = key_valid_BxS
        else:
          valid_BxQ = (slots_BxQ >= 0) & jnp.take_along_axis(
              key_valid_BxS, jnp.maximum(slots_BxQ, 0), axis=1)
        rows_BxQ = jnp.where(valid_BxQ, positions_BxQ % block_length, -1)
      key_valid = ops.BlockCausal(
          key_valid_BxS, blocks_BxQ if key_blocks_BxS is None
          else key_blocks_BxS, blocks_BxQ, rows_BxQ,
          None if rows_BxQ is None else block_length)
    new_kv = []
    for layer in range(cfg.n_layers):
      kv = None if cache is None else cache.layer(layer)
      x_BxQxE, kv = Block(cfg, self.param_dtype, self.implementation,
                          sow_mass=layer >= mass_from_layer, layer=layer,
                          name=f"layers_{layer}")(
          x_BxQxE, positions_BxQ, cos_BxQxR, sin_BxQxR, key_valid, kv,
          slots_BxQ, extras)
      if kv is not None:
        new_kv.append(kv)
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
    new_cache = None if cache is None else KVCache.from_layers(new_kv)
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
    return quantize.quantize_params(params, config)
  init = jax.jit(lambda r: init_variables(config, r, param_dtype,
                                          head_init_scale)["params"])
  return init(rng)


def init_variables(config: ModelConfig, rng: jax.Array, param_dtype=None,
                   head_init_scale: float = 1.0):
  """The flax init of `config`'s Transformer on a one-token row (what
  init_params jits and roles.table traces)."""
  model = Transformer(config, jnp.dtype(param_dtype or config.dtype),
                      head_init_scale)
  tokens = jnp.zeros((1, 1), jnp.int32)
  return model.init(rng, tokens, tokens, jnp.ones((1, 1), bool))


roles.register_model(ModelConfig, init_variables)
