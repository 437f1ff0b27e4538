"""Loss-free expert balancing of MoE training: each expert's router bias
moves a fixed step towards the layer's mean load after every step."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def balance_experts(params: dict, loads: dict, rate: float) -> dict:
  """params with each MoE layer's expert_bias moved `rate` towards balance:
  + for experts given fewer tokens than the layer's mean, - for more
  (DeepSeek-V3's loss-free balancing, which LLaDA2's expert bias is for)."""
  params = dict(params)
  for name, load_X in loads.items():
    layer = dict(params[name])
    moe = dict(layer["moe"])
    moe["expert_bias"] = moe["expert_bias"] + rate * jnp.sign(
        jnp.mean(load_X) - load_X)
    layer["moe"], params[name] = moe, layer
  return params


def expert_imbalance(loads: dict) -> jax.Array:
  """The busiest expert's tokens over the mean, averaged over MoE layers
  (1.0 is perfect balance)."""
  return jnp.mean(jnp.stack([jnp.max(l) / jnp.maximum(jnp.mean(l), 1e-9)
                             for l in loads.values()]))
