"""Each parameter's sharding and quantization role, declared where the
parameter is made.

A model part declares a role for each parameter it creates (`declare`);
`table(config)` traces the model's init abstractly once per config and
collects them, so the mesh layout (parallel.py), the 8-bit conversion
(quantize.py) and the loaders read one table instead of matching names.
A parameter no part declares is replicated and never quantized. This module
imports no model: the module that defines one registers its init
(`register_model`), so the model, the mesh layout and quantize.py all sit
above it.

Stored layouts (unquantized): projections [in, out], experts [X, in, out]
(X experts), the embedding [V, E]. Quantized, a projection becomes
kernel_q [out, in] + scale [out, Z] and an expert stack kernel_q
[X, out, in] + scale [X, out, Z]; the embedding keeps its rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator

import jax

SHARDS = ("replicated", "columns", "vocab_rows", "experts", "dim")
QUANTIZE = (None, "projection", "head", "embedding")


@dataclasses.dataclass(frozen=True)
class Role:
  """shard: how the mesh's "model" axis splits it: replicated; columns (the
  output features of a projection, a bias's only axis); vocab_rows (the
  embedding's rows); experts (the leading expert axis of a stack); dim
  (the stored dimension `axis`: the heads or MLP width of an einsum
  weight stored with them on another axis than the last).
  quantize: which 8-bit conversion takes it (None: none); "head" and
  "embedding" only when the config asks for them.
  float32: kept in float32 whatever the checkpoint's dtype (a router, whose
  choices a bf16 rounding would change)."""

  shard: str = "replicated"
  quantize: str | None = None
  float32: bool = False
  axis: int = 0

  def __post_init__(self):
    if self.shard not in SHARDS or self.quantize not in QUANTIZE:
      raise ValueError(f"bad role {self}: shard in {SHARDS}, quantize in "
                       f"{QUANTIZE}")

  def axes(self, ndim: int, quantized: bool = False) -> tuple:
    """Mesh axis per dimension of the stored array (quantized: its
    kernel_q or scale)."""
    out = [None] * ndim
    if self.shard == "columns":
      out[0 if ndim == 1 else (-2 if quantized else -1)] = "model"
    elif self.shard in ("vocab_rows", "experts"):
      out[0] = "model"
    elif self.shard == "dim":
      out[self.axis] = "model"
    return tuple(out)


REPLICATED = Role()
_collecting: list[dict[str, Role]] = []


def declare(module, name: str, role: Role) -> None:
  """Records that `module`'s parameter `name` has `role` (a no-op unless
  `table` is tracing)."""
  if _collecting:
    path = "/".join((*module.scope.path, name))
    _collecting[-1][path] = role


@contextlib.contextmanager
def _collect() -> Iterator[dict[str, Role]]:
  found: dict[str, Role] = {}
  _collecting.append(found)
  try:
    yield found
  finally:
    _collecting.pop()


# {config class: init(config, rng) -> the model's variables}, registered by
# the module that defines the model (model/transformer.py).
_MODELS: dict[type, Callable[[Any, jax.Array], Any]] = {}


def register_model(config_type: type,
                   init: Callable[[Any, jax.Array], Any]) -> None:
  """Lets `table` trace configs of `config_type`: `init(config, rng)` runs
  the model's flax init, whose parts `declare` their parameters."""
  _MODELS[config_type] = init


@functools.lru_cache(maxsize=64)
def table(config) -> dict[str, Role]:
  """{param path: Role} of every declared parameter of the unquantized
  model of `config` (traced, nothing computed); a family config with its
  own `param_roles()` (architectures with a loader) gives its table."""
  if hasattr(config, "param_roles"):
    return config.param_roles()
  init = next((_MODELS[t] for t in type(config).__mro__ if t in _MODELS),
              None)
  if init is None:
    raise TypeError(f"no model registered for {type(config).__name__} "
                    "(roles.register_model; flash_dllm_jax.model registers "
                    "ModelConfig's)")
  plain = config.replace(quantize=None, quantize_head=False,
                         quantize_embedding=False)
  with _collect() as found:
    jax.eval_shape(lambda r: init(plain, r), jax.random.key(0))
  return dict(found)


_QUANTIZED_LEAVES = ("/kernel_q", "/scale")


def role_of(config, path: str) -> tuple[Role, bool]:
  """(role, is a quantized leaf) of the stored parameter at `path`: a
  kernel_q or scale takes the role of the weight it stands for."""
  roles = table(config)
  if path in roles:
    return roles[path], False
  for leaf in _QUANTIZED_LEAVES:
    if path.endswith(leaf):
      base = path.removesuffix(leaf)
      for candidate in (base + "/kernel", base):
        role = roles.get(candidate)
        if role is not None and role.quantize is not None:
          return role, True
  return REPLICATED, False


def quantizes(config, path: str) -> bool:
  """Whether the unquantized parameter at `path` is stored in 8 bits under
  `config`'s quantize, quantize_head and quantize_embedding."""
  kind = table(config).get(path, REPLICATED).quantize
  return (kind == "projection" or (kind == "head" and config.quantize_head)
          or (kind == "embedding" and config.quantize_embedding))


def stored_dtype(config, path: str, dtype):
  """The dtype parameter `path` is kept in when the rest is in `dtype`
  (None: as stored, for 8-bit kernels and their scales)."""
  role, quantized = role_of(config, path)
  if quantized:
    return None
  return "float32" if role.float32 else dtype


def is_quantized_leaf(config, path: str) -> bool:
  """Whether `path` is an 8-bit kernel or its scale (kept in its dtype)."""
  return role_of(config, path)[1]
