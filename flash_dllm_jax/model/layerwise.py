"""The transformer one layer at a time, for strategies that decide per layer.

`Transformer.__call__` runs every layer on one set of query rows. Elastic-Cache
decides after each layer whether the rest of the model runs on the query rows
or on the whole sequence, so it drives the same parameters through these
pieces instead: `embed`, `layer` (one `Block`, cached, with its K/V written
and the attention mass of chosen rows), `head`, plus `queries` and
`probabilities`, the per-head attention of a few rows that the drift test
compares between steps. Composed over every layer, embed -> layer -> head
gives exactly `Transformer.apply` (tests/test_elastic_cache.py checks it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import fuse
from flash_dllm_jax.model.layers import (Linear, RMSNorm, apply_rope,
                                         embed_lookup, rope_angles)
from flash_dllm_jax.model.transformer import Block, CachedExtras, vocab_head


def embed(config: ModelConfig, params, tokens_BxQ: jax.Array) -> jax.Array:
  """The input of layer 0: x_BxQxE in the compute dtype (an 8-bit
  embedding scales only the rows it gathers)."""
  return embed_lookup(params["embed"], tokens_BxQ, jnp.dtype(config.dtype))


def layer(config: ModelConfig, params, index: int, x_BxQxE: jax.Array,
          positions_BxQ: jax.Array, key_valid_BxS: jax.Array,
          kv: tuple[jax.Array, jax.Array], slots_BxQ: jax.Array,
          mass_rows_BxQ: jax.Array | None = None,
          implementation: str | None = None):
  """Layer `index` on the query rows against its K/V cache (k_BxSxKxD,
  v_BxSxKxD): their K/V are written at slots_BxQ (-1 skips a row) and they
  attend over every valid slot. Returns (x_BxQxE, (k, v), mass_BxS or None),
  mass summing over heads and mass_rows_BxQ the probability of each slot."""
  cos_BxQxD, sin_BxQxD = rope_angles(positions_BxQ, config.rope_dim,
                                     config.rope_theta)
  block = Block(config, jnp.dtype(config.dtype), implementation,
                sow_mass=mass_rows_BxQ is not None, layer=index)
  (x_BxQxE, kv), state = block.apply(
      {"params": params[f"layers_{index}"]}, x_BxQxE, positions_BxQ,
      cos_BxQxD, sin_BxQxD, key_valid_BxS, kv, slots_BxQ,
      CachedExtras(mass_rows_BxQ=mass_rows_BxQ), mutable=["intermediates"])
  masses = state.get("intermediates", {}).get("attention_mass")
  return x_BxQxE, kv, None if masses is None else masses[0]


def head(config: ModelConfig, params, x_BxRxE: jax.Array,
         implementation: str | None = None) -> jax.Array:
  """Final norm and vocabulary head: logits_BxRxV in float32."""
  x_BxRxE = RMSNorm(config.rms_norm_eps, implementation=implementation).apply(
      {"params": params["final_norm"]}, x_BxRxE)
  head_ = params["lm_head"]
  if config.quantize_head:
    head_ = (head_["kernel_q"], head_["scale"], None)
  return vocab_head(config, head_, x_BxRxE, implementation)


def queries(config: ModelConfig, params, index: int, x_BxTxE: jax.Array,
            positions_BxT: jax.Array, implementation: str | None = None
            ) -> jax.Array:
  """The post-RoPE attention queries q_BxTxHxD that layer `index` computes
  for rows whose layer input is x_BxTxE (a pure function of it, so a past
  step's queries are recomputed from the stored layer inputs)."""
  cfg = config
  p = params[f"layers_{index}"]
  b, t, _ = x_BxTxE.shape
  n_BxTxE = RMSNorm(cfg.rms_norm_eps, implementation=implementation).apply(
      {"params": p["attn_norm"]}, x_BxTxE)
  if cfg.fused_qkv:
    q_BxTxHxD = fuse.split_qkv(Linear(
        fuse.qkv_features(cfg), use_bias=cfg.qkv_bias, quantize=cfg.quantize,
        implementation=implementation).apply(
            {"params": p["qkv_proj"]}, n_BxTxE), cfg)[0]
  else:
    q_BxTxHxD = Linear(cfg.n_heads * cfg.head_dim, use_bias=cfg.qkv_bias,
                       quantize=cfg.quantize,
                       implementation=implementation).apply(
        {"params": p["q_proj"]}, n_BxTxE).reshape(b, t, cfg.n_heads,
                                                  cfg.head_dim)
  if cfg.spec.attention.qk_norm:
    q_BxTxHxD = RMSNorm(cfg.rms_norm_eps, implementation=implementation
                        ).apply({"params": p["q_norm"]}, q_BxTxHxD)
  cos_BxTxD, sin_BxTxD = rope_angles(positions_BxT, cfg.rope_dim,
                                     cfg.rope_theta)
  return apply_rope(q_BxTxHxD, cos_BxTxD, sin_BxTxD, cfg.rope_in_float32)


def probabilities(q_BxTxHxD: jax.Array, k_BxSxKxD: jax.Array,
                  key_valid_BxS: jax.Array) -> jax.Array:
  """Per-head attention probabilities p_BxTxHxS (float32) of post-RoPE
  queries over post-RoPE cached keys; invalid keys get exactly 0.

  Plain JAX, materialising the scores: the drift test needs each head's
  distribution for a handful of rows, which the fused attention kernel
  never writes out (it only accumulates the summed mass)."""
  b, t, h, d = q_BxTxHxD.shape
  k = k_BxSxKxD.shape[2]
  q_BxTxKxJxD = q_BxTxHxD.reshape(b, t, k, h // k, d)
  s_BxTxKxJxS = jnp.einsum("btkjd,bskd->btkjs", q_BxTxKxJxD, k_BxSxKxD,
                           preferred_element_type=jnp.float32)
  s_BxTxKxJxS = s_BxTxKxJxS / math.sqrt(d)
  valid = key_valid_BxS[:, None, None, None, :]
  s_BxTxKxJxS = jnp.where(valid, s_BxTxKxJxS, -jnp.inf)
  p_BxTxKxJxS = jax.nn.softmax(s_BxTxKxJxS, axis=-1)
  return jnp.where(valid, p_BxTxKxJxS, 0.0).reshape(b, t, h, -1)
