"""8-bit weights: the formats, quantizing a kernel, a parameter tree.

A quantized projection stores `kernel_q` [O, E] (out x in, the layout
cuBLASLt's fp8 GEMM and the weight-streaming kernel read) in the format's
8-bit dtype and float32 `scale` [O, Z]: Z = 1 is one scale per output
channel, Z = E / group one per group of `group` inputs. The weight it stands
for is kernel_q * scale (pallas_kernels/qmatmul/reference.py). Quantization
is symmetric absmax with round to nearest; an all-zero channel or group
gets scale 1 (and zeros).

Which parameters are quantized is each one's role (roles.py):
every projection of a block (q/k/v, attn_out, gate/up/down, each expert's)
is; the LM head stays in its dtype unless the config's `quantize_head`:
then it is stored like a projection ('lm_head/kernel_q' [V, E],
'lm_head/scale' [V, 1]) in the format's `head_format` (per output
channel). The token embedding stays in its dtype unless
`quantize_embedding`: then it is stored the same way, kernel_q [V, E] and
scale [V, 1] in `head_format`, one scale per token row (a gather's output
channel), and a lookup scales only the rows it gathers
(model/layers.embed_lookup). An expert stack [X, E, M] becomes kernel_q
[X, M, E] and scale [X, M, Z], each expert quantized as a projection.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from flash_dllm_jax import roles
from pallas_kernels.common import on_gpu


@dataclasses.dataclass(frozen=True)
class Format:
  """One 8-bit weight format.

  dtype: the stored weight's dtype. qmax: the largest stored magnitude.
  group: inputs per scale (None: one scale per output channel).
  w8a8: activations go to e4m3 too (per-row dynamic scales) on GPUs with
    fp8 tensor cores (compute capability >= 8.9) and on CPU (the reference,
    so CPU tests see the H200's numerics); weight-only elsewhere.
  head_format: the format of the LM head when it is quantized.
  """

  name: str
  dtype: Any
  qmax: float
  group: int | None
  w8a8: bool
  head_format: str


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp8", jnp.float8_e4m3fn, 448.0, None, True, "fp8"),
    Format("int8", jnp.int8, 127.0, None, False, "int8"),
    Format("int8-g128", jnp.int8, 127.0, 128, False, "int8"),
)}

FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


def get_format(name: str) -> Format:
  """The Format called `name`, or a ValueError naming the known ones."""
  if name not in FORMATS:
    raise ValueError(f"unknown quantization format {name!r}; known formats: "
                     f"{', '.join(FORMATS)}")
  return FORMATS[name]


def activations(fmt: str) -> str:
  """'fp8' (W8A8) or 'bf16' (weight-only) for format `fmt` on the default
  backend (read at trace time)."""
  if not get_format(fmt).w8a8:
    return "bf16"
  if not on_gpu():
    return "fp8"
  capability = getattr(jax.devices()[0], "compute_capability", "0.0")
  major, minor = (int(p) for p in str(capability).split(".")[:2])
  return "fp8" if (major, minor) >= FP8_MIN_COMPUTE_CAPABILITY else "bf16"


def scale_columns(fmt: str, e: int) -> int:
  """Z: how many scales one output channel of E inputs has."""
  group = get_format(fmt).group
  return 1 if group is None else e // group


def quantizes(config, path: str) -> bool:
  """Whether the unquantized parameter at `path` is stored in 8 bits under
  the config's quantize, quantize_head and quantize_embedding."""
  return config.quantize is not None and roles.quantizes(config, path)


def _kind(config, path: str) -> str | None:
  return roles.table(config).get(path, roles.REPLICATED).quantize


def leaf_format(config, path: str) -> str:
  """The format the parameter at `path` is quantized to: `head_format` for
  the LM head and the embedding, config.quantize for the projections."""
  if _kind(config, path) in ("head", "embedding"):
    return get_format(config.quantize).head_format
  return config.quantize


def check_leaf(config, path: str, shape: tuple[int, ...]) -> None:
  """check_shape of the parameter at `path` (stored shape) in its
  leaf_format: a kernel [.., in, out], the embedding [V, E] as [E, V]."""
  shape = tuple(shape)
  if _kind(config, path) == "embedding":
    shape = shape[::-1]
  check_shape(leaf_format(config, path), shape[-2:], path)


def check_shape(fmt: str, shape_ExO: tuple[int, ...], path: str) -> None:
  """A ValueError naming `path` when its kernel cannot take `fmt`."""
  group = get_format(fmt).group
  if len(shape_ExO) != 2:
    raise ValueError(f"{path}: a kernel to quantize must be 2-D [in, out], "
                     f"got shape {tuple(shape_ExO)}")
  if group is not None and shape_ExO[0] % group:
    raise ValueError(f"{path} has shape {tuple(shape_ExO)} [in, out]: format "
                     f"{fmt} needs its input size {shape_ExO[0]} divisible "
                     f"by {group}")


@functools.partial(jax.jit, static_argnames=("fmt", "rows"))
def _quantize(kernel: jax.Array, fmt: str, rows: bool = False):
  """kernel is [E, O], or with `rows` already [O, E] (the embedding)."""
  f = get_format(fmt)
  w_OxE = kernel.astype(jnp.float32)
  w_OxE = w_OxE if rows else w_OxE.T
  o, e = w_OxE.shape
  z = scale_columns(fmt, e)
  w_OxZxG = w_OxE.reshape(o, z, e // z)
  scale_OxZ = jnp.max(jnp.abs(w_OxZxG), axis=-1) / f.qmax
  scale_OxZ = jnp.where(scale_OxZ > 0, scale_OxZ, 1.0)
  q_OxZxG = jnp.clip(w_OxZxG / scale_OxZ[:, :, None], -f.qmax, f.qmax)
  if jnp.issubdtype(f.dtype, jnp.integer):
    q_OxZxG = jnp.round(q_OxZxG)
  return q_OxZxG.reshape(o, e).astype(f.dtype), scale_OxZ


def quantize_weight(kernel_ExO: jax.Array, fmt: str,
                    path: str = "kernel") -> tuple[jax.Array, jax.Array]:
  """(w_OxE in the format's dtype, scale_OxZ float32) of a kernel [E, O];
  runs where the kernel is (jitted, on device)."""
  check_shape(fmt, tuple(kernel_ExO.shape), path)
  return _quantize(jnp.asarray(kernel_ExO), fmt)


def quantize_rows(table_VxE: jax.Array, fmt: str, path: str = "embed"
                  ) -> tuple[jax.Array, jax.Array]:
  """(w_VxE in the format's dtype, scale_VxZ float32) of a table [V, E]
  quantized per row (the embedding: no transpose, jitted, on device)."""
  check_shape(fmt, tuple(table_VxE.shape)[::-1], path)
  return _quantize(jnp.asarray(table_VxE), fmt, rows=True)


def is_quantized(params) -> bool:
  """Whether a parameter tree already holds quantized kernels."""
  return any(path.endswith("kernel_q") for path in _flatten(params))


def quantize_leaf(config, path: str, array: jax.Array
                  ) -> dict[str, jax.Array]:
  """{path: array} for a parameter that stays, or its two quantized
  entries ('.../kernel_q', '.../scale') for one that `quantizes`."""
  if not quantizes(config, path):
    return {path: array}
  fmt, kind = leaf_format(config, path), _kind(config, path)
  if kind == "embedding":
    w_OxE, scale_OxZ = quantize_rows(array, fmt, path)
  elif array.ndim == 3:  # an expert stack [X, E, M]
    check_shape(fmt, tuple(array.shape[1:]), path)
    w_OxE, scale_OxZ = jax.vmap(lambda k: _quantize(k, fmt))(
        jnp.asarray(array))
  else:
    w_OxE, scale_OxZ = quantize_weight(array, fmt, path)
  prefix = path.removesuffix("kernel") if path.endswith("/kernel") else (
      path + "/")
  return {prefix + "kernel_q": w_OxE, prefix + "scale": scale_OxZ}


def quantize_params(params, config):
  """The tree with every parameter `config` quantizes (its projections; the
  LM head and the embedding where it says so) in config.quantize, each on
  the device(s) its kernel is on; other parameters are left as they are.
  A tree already quantized is an error."""
  get_format(config.quantize)
  flat = _flatten(params)
  if is_quantized(params):
    raise ValueError("these parameters are already quantized (they hold "
                     "kernel_q entries); quantize a bf16/float32 tree")
  for path, array in flat.items():  # every shape checked before any work
    if quantizes(config, path):
      check_leaf(config, path, array.shape)
  out = {}
  for path, array in flat.items():
    out.update(quantize_leaf(config, path, array))
  return _unflatten(out)


def weight_bytes(params) -> int:
  """Bytes the parameters take in memory (all leaves, any dtype)."""
  return int(sum(np.prod(x.shape, dtype=np.int64) * jnp.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(params)))


def _flatten(params) -> dict[str, Any]:
  return traverse_util.flatten_dict(dict(params), sep="/")


def _unflatten(flat: dict[str, Any]):
  return traverse_util.unflatten_dict(flat, sep="/")


def add_flags(parser, writes: bool = False) -> None:
  """--quantize FMT, --quantize-head and --quantize-embedding on an
  argparse parser; writes: the command writes a checkpoint (the converter)
  rather than loading one to run."""
  def describe(f: Format) -> str:
    scales = ("per output channel" if f.group is None
              else f"per {f.group} inputs")
    acts = "W8A8 where the GPU has fp8" if f.w8a8 else "weight-only"
    return f"{f.name}: {'e4m3' if f.w8a8 else 'int8'}, {scales}, {acts}"
  parser.add_argument(
      "--quantize", choices=tuple(FORMATS), default=None,
      help="8-bit weights: " + "; ".join(map(describe, FORMATS.values()))
      + (" (the checkpoint is written quantized and its config records the "
         "format; default: not quantized)" if writes else
         " (a bf16 checkpoint is quantized as it loads; default: as stored)"))
  parser.add_argument("--quantize-head", action="store_true",
                      help="quantize the LM head too (per output channel)")
  parser.add_argument("--quantize-embedding", action="store_true",
                      help="store the token embedding in 8 bits too (per "
                      "token row; a lookup scales only the rows it takes)")


def check_params(params, config) -> None:
  """A ValueError when the tree and config disagree on quantization."""
  held = is_quantized(params)
  if config.quantize is not None and not held:
    raise ValueError(f"the config says quantize={config.quantize!r} but the "
                     "parameters hold unquantized kernels (quantize them "
                     "with quantize_params, or load(..., quantize=))")
  if config.quantize is None and held:
    raise ValueError("the parameters hold 8-bit kernels but the config has "
                     "quantize=None (use the config load returns with them)")
  flat = _flatten(params)
  for kind, field in (("head", "quantize_head"),
                      ("embedding", "quantize_embedding")):
    for path, role in roles.table(config).items():
      if role.quantize != kind:
        continue
      stored = path + "/kernel_q" in flat
      if (stored or path in flat) and stored != getattr(config, field):
        raise ValueError(f"the config says {field}={not stored} but the "
                         f"parameters hold {path!r} "
                         f"{'in 8 bits' if stored else 'unquantized'} (use "
                         "the config load returns with them)")
