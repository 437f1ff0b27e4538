"""DiffusionGemma's 8-bit weights in the engine's formats (quantize.py):
every projection of a layer (q, k / kv, the attention output, the dense
MLP's gate/up and down, each expert's) and of the self-conditioning MLP is
stored as `kernel_q` [O, E] in the format's 8-bit dtype and float32
`scale` [O, Z], the weight seen as a kernel [E, O] (E the contracted
width); the router, the norms, the scales and the tied embedding stay in
their dtype. Dense projections run through ops.linear.quantized_linear
(the engine's 8-bit matmul: the reference on CPU, fp8 W8A8 for "fp8",
the streaming kernel on a GPU); experts are dequantized a chunk at a time.

Each official weight maps to its kernel [E, O] by `_TO_KERNEL` (a
transpose and reshape) and back by the inverse, applied to the product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax import quantize as qlib
from flash_dllm_jax.ops.linear import quantized_linear


def is_q(w) -> bool:
  return isinstance(w, dict) and "kernel_q" in w


def _kernel(name: str, w):
  """The [E, O] kernel of official weight `name` (its last path part)."""
  if name in ("q_einsum", "k_einsum"):  # [N, D, H]
    n, d, h = w.shape
    return w.transpose(1, 0, 2).reshape(d, n * h)
  if name == "kv_einsum":  # [2, K, D, H]
    c, k, d, h = w.shape
    return w.transpose(2, 0, 1, 3).reshape(d, c * k * h)
  if name == "attn_vec_einsum":  # [N, H, D]
    return w.reshape(-1, w.shape[-1])
  if name == "gating_einsum":  # [2, F, D]
    two, f, d = w.shape
    return w.transpose(2, 0, 1).reshape(d, two * f)
  if name == "linear":  # [F, D]
    return w
  raise KeyError(name)


def _expert(name: str, w_X):
  """Per expert [X, E, O]: gating [X, 2, M, D] -> [X, D, 2M]; linear
  [X, M, D] as is."""
  if name == "gating_einsum":
    x, two, m, d = w_X.shape
    return w_X.transpose(0, 3, 1, 2).reshape(x, d, two * m)
  return w_X


def quantize_tree(params, config, fmt: str):
  """`params` with every projection stored in `fmt` (on device)."""
  qlib.get_format(fmt)

  def one(name, w):
    kernel = _kernel(name, w)
    qlib.check_shape(fmt, tuple(kernel.shape), name)
    w_q, scale = qlib.quantize_weight(kernel, fmt, name)
    return {"kernel_q": w_q, "scale": scale}

  def experts(name, w):
    kernel = _expert(name, w)
    qlib.check_shape(fmt, tuple(kernel.shape[1:]), name)
    w_q, scale = jax.vmap(lambda k: qlib.quantize_weight(k, fmt, name))(
        kernel)
    return {"kernel_q": w_q, "scale": scale}

  def mlp(p):
    return {k: one(k, v) for k, v in p.items()}

  out = dict(params)
  out["self_conditioner"] = {**params["self_conditioner"],
                             "ffw": mlp(params["self_conditioner"]["ffw"])}
  for i in range(config.n_layers):
    lp = dict(params[f"layer_{i}"])
    lp["attn"] = {k: ({"w": one(k, v["w"])} if k.endswith("einsum") else v)
                  for k, v in lp["attn"].items()}
    if config.moe_experts:
      lp["mlp2"] = mlp(lp["mlp2"])
      m = dict(lp["mlp"])
      for k in ("gating_einsum", "linear"):
        m[k] = {"w": experts(k, m[k]["w"])}
      lp["mlp"] = m
    else:
      lp["mlp"] = mlp(lp["mlp"])
    out[f"layer_{i}"] = lp
  return out


def project(x, w, fmt: str | None, out_shape: tuple[int, ...]):
  """x [..., E] @ an 8-bit kernel -> [..., *out_shape], in x's dtype."""
  lead = x.shape[:-1]
  x3 = x.reshape(-1, 1, x.shape[-1]) if x.ndim != 3 else x
  y = quantized_linear(x3, w["kernel_q"], w["scale"], fmt=fmt)
  return y.reshape(*lead, *out_shape)


def dequantize_experts(w, dtype):
  """[X', O, E] stored -> the kernels [X', E, O] in `dtype`."""
  q, s = w["kernel_q"], w["scale"]
  x, o, e = q.shape
  z = s.shape[-1]
  full = (q.astype(jnp.float32).reshape(x, o, z, e // z)
          * s[..., None]).reshape(x, o, e)
  return full.transpose(0, 2, 1).astype(dtype)


def _from_kernel(name: str, k_ExO, shape):
  """`_kernel`'s inverse: the [E, O] kernel back to the official `shape`."""
  if name in ("q_einsum", "k_einsum"):
    n, d, h = shape
    return k_ExO.reshape(d, n, h).transpose(1, 0, 2)
  if name == "kv_einsum":
    c, k, d, h = shape
    return k_ExO.reshape(d, c, k, h).transpose(1, 2, 0, 3)
  if name == "gating_einsum" and len(shape) == 3:
    two, f, d = shape
    return k_ExO.reshape(d, two, f).transpose(1, 2, 0)
  if name == "gating_einsum":  # experts [X, 2, M, D] from [X, D, 2M]
    x, two, m, d = shape
    return k_ExO.reshape(x, d, two, m).transpose(0, 2, 3, 1)
  return k_ExO.reshape(shape)


def dequantize_tree(qparams, shapes_of: dict[str, tuple[int, ...]]):
  """The float32 official tree an 8-bit tree stands for (the weights
  kernel_q * scale), given {path: official shape} (checkpoint.
  param_shapes): the reference 8-bit forwards are tested against."""
  def walk(node, path):
    if is_q(node):
      q, s = node["kernel_q"], node["scale"]
      *lead, o, e = q.shape
      z = s.shape[-1]
      w = (q.astype(jnp.float32).reshape(*lead, o, z, e // z)
           * s[..., None]).reshape(*lead, o, e)
      kernel = jnp.swapaxes(w, -1, -2)
      parts = path.split("/")
      name = parts[-2] if parts[-1] == "w" else parts[-1]
      return _from_kernel(name, kernel, shapes_of[path])
    if isinstance(node, dict):
      return {k: walk(v, f"{path}/{k}" if path else k)
              for k, v in node.items()}
    return node
  return walk(qparams, "")
