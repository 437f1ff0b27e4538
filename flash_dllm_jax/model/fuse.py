"""One q/k/v projection per layer: the stored q_proj, k_proj and v_proj
weights joined into `qkv_proj` at load time.

At batch 1 a decode step's GEMMs are reads of the weights, and a
4096 x 4096 projection reads its 32 MB further from the copy rate than a
4096 x 12288 one reads its 96 MB (BENCHMARKS.md, "Strategy steps"), so one
GEMM for the three is faster. The columns are grouped by K/V head, each
group J query heads then the key head then the value head ([E, K, J+2, D]
flattened), so splitting the columns over a tensor-parallel "model" axis
still hands every device whole heads (parallel.check_config asks that it
divides K). Checkpoints keep the three weights; `checkpoint.load` joins
them (config.fused_qkv records it).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from flash_dllm_jax.config import ModelConfig

PARTS = ("q_proj", "k_proj", "v_proj")


def joins_by_default() -> bool:
  """Whether `load(fuse_qkv=None)` joins q/k/v: on a GPU backend."""
  return jax.default_backend() in ("gpu", "cuda", "rocm")


def qkv_features(config: ModelConfig) -> int:
  """Output width of the joined projection: K * (J + 2) * D."""
  return config.n_kv_heads * (config.q_per_kv + 2) * config.head_dim


def split_qkv(y_BxQxO: jax.Array, config: ModelConfig):
  """(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD) from the joined projection's output."""
  b, q = y_BxQxO.shape[:2]
  k, j, d = config.n_kv_heads, config.q_per_kv, config.head_dim
  y = y_BxQxO.reshape(b, q, k, j + 2, d)
  return (y[:, :, :, :j].reshape(b, q, k * j, d), y[:, :, :, j],
          y[:, :, :, j + 1])


# Leaves whose output features are the first axis (8-bit [O, E] kernels and
# their [O, Z] scales); "kernel" and "bias" have them last.
OUT_FIRST = ("kernel_q", "scale")


def _join(q, k, v, config: ModelConfig, out_first: bool):
  """q, k, v with H*D, K*D, K*D output features -> K*(J+2)*D grouped by
  head, along the last axis (or the first, out_first)."""
  if out_first:
    return jnp.moveaxis(_join(*(jnp.moveaxis(a, 0, -1) for a in (q, k, v)),
                              config, False), -1, 0)
  kh, j, d = config.n_kv_heads, config.q_per_kv, config.head_dim
  lead = q.shape[:-1]
  parts = (q.reshape(*lead, kh, j, d), k.reshape(*lead, kh, 1, d),
           v.reshape(*lead, kh, 1, d))
  return jnp.concatenate(parts, axis=-2).reshape(*lead, kh * (j + 2) * d)


def fuse_qkv(params, config: ModelConfig):
  """(params with qkv_proj per layer, config with fused_qkv=True).

  Each layer's three weights are joined in one jitted call that donates
  them, so peak memory grows by about one layer's q/k/v. Under a mesh the
  joined weight keeps the column sharding (whole heads per device).
  """
  if config.fused_qkv:
    return params, config
  params = dict(params)

  def join_layer(layer):
    out = {n: v for n, v in layer.items() if n not in PARTS}
    out["qkv_proj"] = {
        name: _join(*(layer[p][name] for p in PARTS), config,
                    name in OUT_FIRST)
        for name in layer["q_proj"]}
    return out

  join = jax.jit(join_layer, donate_argnums=0)
  for i in range(config.n_layers):
    name = f"layers_{i}"
    missing = [p for p in PARTS if p not in params[name]]
    if missing:
      raise ValueError(f"{name} lacks {missing}: cannot join q/k/v")
    with warnings.catch_warnings():  # q/k/v are donated to free them
      warnings.filterwarnings("ignore", message="Some donated buffers")
      params[name] = join(dict(params[name]))
  return params, config.replace(fused_qkv=True)
