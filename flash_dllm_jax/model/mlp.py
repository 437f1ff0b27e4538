"""SwiGLU MLP and the residual projections of a block, bf16 or 8-bit.

With 8-bit weights the projections go through the fused epilogues of
ops.quantized_linear: the residual added to attn_out's and down's float32
sums, silu(gate) * up from gate's and up's.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig


def residual_linear(cfg: ModelConfig, dense, name: str, features: int,
                    x_BxQxI: jax.Array, residual_BxQxO: jax.Array | None,
                    implementation=None) -> jax.Array:
  """residual + x @ W for the projection `name` back to the residual stream
  (gathered under a mesh; residual None: the product alone)."""
  if cfg.quantize is None:
    y_BxQxO = dense(name, features, gathered=True)(x_BxQxI)
    return y_BxQxO if residual_BxQxO is None else residual_BxQxO + y_BxQxO
  w, s, _ = dense(name, features)(x_BxQxI, weights_only=True)
  return ops.quantized_linear(x_BxQxI, w, s, fmt=cfg.quantize, gathered=True,
                              residual_BxQxO=residual_BxQxO,
                              implementation=implementation)


def swiglu(cfg: ModelConfig, dense, n_BxQxE: jax.Array, hidden: int,
           residual_BxQxE: jax.Array | None, implementation=None
           ) -> jax.Array:
  """residual + down(silu(gate(n)) * up(n)) with gate_proj, up_proj,
  down_proj of width `hidden` made by `dense(name, features)`."""
  if cfg.quantize is None:
    h_BxQxF = nn.silu(dense("gate_proj", hidden)(n_BxQxE)) * dense(
        "up_proj", hidden)(n_BxQxE)
  else:
    w_gate, s_gate, _ = dense("gate_proj", hidden)(n_BxQxE,
                                                   weights_only=True)
    w_up, s_up, _ = dense("up_proj", hidden)(n_BxQxE, weights_only=True)
    h_BxQxF = ops.quantized_linear(n_BxQxE, w_gate, s_gate, fmt=cfg.quantize,
                                   up=(w_up, s_up),
                                   implementation=implementation)
  return residual_linear(cfg, dense, "down_proj", cfg.d_model, h_BxQxF,
                         residual_BxQxE, implementation)
