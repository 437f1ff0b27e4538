"""Imports google-deepmind/gemma's genuine modules on Python 3.11 without
its heavy dependencies, for building test fixtures outside CI.

`import_official(root)` puts a finder on sys.meta_path that loads every
`gemma.*` module from the checkout at `root` (a directory holding
`gemma/`): package `__init__.py` files are skipped (empty packages, so the
lazy public API and its imports never run), and the few modules of
images/audio/tokenizer that the text path only names are replaced by the
small stand-ins below. `kauldron` (kd, kontext, ktyping), `jaxtyping` and
`einops` get in-memory stand-ins too, `typing.override` an identity.
`transforms` maps a module name to a function over its source text (for a
file with syntax newer than 3.11). No code of the package is copied here.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import typing
from pathlib import Path
from typing import Callable


def _module(name: str, **attrs) -> types.ModuleType:
  mod = types.ModuleType(name)
  mod.__dict__.update(attrs)
  sys.modules[name] = mod
  return mod


class ArrayTypeMeta(type):
  """ktyping's array annotation: `Float['*B L D']` has `shape_spec`."""
  shape_spec = None


def _array_kind(kind: str):
  class _Kind(metaclass=ArrayTypeMeta):
    def __class_getitem__(cls, spec):
      return ArrayTypeMeta(f"{kind}[{spec!r}]", (), {"shape_spec": spec})
  _Kind.__name__ = kind
  return _Kind


def _install_kauldron():
  import flax.linen as nn
  import jax

  class Identity(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x

  class _Path(tuple):
    @classmethod
    def from_jax_path(cls, path):
      return cls(str(p) for p in path)

  kinds = {k: _array_kind(k) for k in (
      "Array", "Bool", "Float", "Int", "UInt8", "UInt32", "PRNGKey",
      "PyTree", "Scalar", "Shape")}
  ktyping = _module("kauldron.ktyping", typechecked=lambda f: f, **kinds)
  atm = _module("kauldron.ktyping.array_type_meta",
                ArrayTypeMeta=ArrayTypeMeta,
                is_array_type=lambda a: isinstance(a, ArrayTypeMeta))
  ktyping.array_type_meta = atm
  ktyping_typing = _module("kauldron.typing", typechecked=lambda f: f,
                           **kinds)
  sharding = types.SimpleNamespace(
      ShardingTree=typing.Any,
      with_sharding_constraint=lambda x, s: x if s is None else
      jax.lax.with_sharding_constraint(x, s))
  kd = _module("kauldron.kd", nn=types.SimpleNamespace(Identity=Identity),
               sharding=sharding)
  kontext = _module("kauldron.kontext", Key=typing.Any, REQUIRED=None,
                    Path=_Path)
  immutabledict = _module("kauldron.utils.immutabledict",
                          ImmutableDict=dict)
  utils = _module("kauldron.utils", immutabledict=immutabledict)
  _module("kauldron", kd=kd, kontext=kontext, ktyping=ktyping,
          typing=ktyping_typing, utils=utils, __path__=[])


def _install_small_deps():
  class AbstractArray:
    dim_str = ""
  _module("jaxtyping", _array_types=types.SimpleNamespace(
      AbstractArray=AbstractArray))
  _module("einops")
  if not hasattr(typing, "override"):
    typing.override = lambda f: f


class _Tokens(enum.IntEnum):
  """The Gemma 4 tokenizer's special ids (as its enum names them)."""
  PAD = 0
  EOS = 1
  BOS = 2
  UNK = 3
  MASK = 4
  START_OF_TURN = 105
  END_OF_TURN = 106
  BEGIN_OF_TOOL_RESPONSE = 50
  IMAGE_PLACEHOLDER = 258880
  START_OF_IMAGE = 255999
  END_OF_IMAGE = 258882
  AUDIO_PLACEHOLDER = 258881
  START_OF_AUDIO = 256000
  END_OF_AUDIO = 258883


class _Stub:
  """Stands for an image/audio config object the text path only stores."""

  def __init__(self, *args, **kwargs):
    self.args, self.kwargs = args, kwargs


_STUBS = {
    "gemma.gm.nn.gemma4.vision._encoder": dict(
        VisionEncoder=_Stub, TOKEN_PLACEHOLDER=-2),
    "gemma.gm.nn.gemma4.audio._modules": dict(ConformerConfig=_Stub),
    "gemma.gm.nn.gemma4.audio._model": dict(AudioTokenizer=_Stub),
    "gemma.gm.text._tokenizer": dict(
        SpecialTokens=_Tokens,
        Gemma3Tokenizer=types.SimpleNamespace(special_tokens=_Tokens),
        Gemma4Tokenizer=types.SimpleNamespace(special_tokens=_Tokens)),
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):

  def __init__(self, root: Path, transforms):
    self.root, self.transforms = root, transforms

  def find_spec(self, name, path=None, target=None):
    if name != "gemma" and not name.startswith("gemma."):
      return None
    rel = Path(*name.split("."))
    is_pkg = (self.root / rel).is_dir()
    if not is_pkg and name not in _STUBS and not (
        self.root / rel.with_suffix(".py")).is_file():
      return None
    return importlib.machinery.ModuleSpec(name, self, is_package=is_pkg)

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    name = module.__name__
    rel = Path(*name.split("."))
    if (self.root / rel).is_dir():
      module.__path__ = [str(self.root / rel)]
      return
    if name in _STUBS:
      module.__dict__.update(_STUBS[name])
      return
    path = self.root / rel.with_suffix(".py")
    source = path.read_text()
    if name in self.transforms:
      source = self.transforms[name](source)
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)


def import_official(root: str | Path,
                    transforms: dict[str, Callable[[str], str]] | None = None
                    ) -> None:
  """Makes `import gemma.<...>` load the genuine modules under `root`."""
  root = Path(root).absolute()
  if not (root / "gemma" / "gm").is_dir():
    raise ValueError(f"{root} holds no gemma/gm (a google-deepmind/gemma "
                     "checkout is expected)")
  _install_kauldron()
  _install_small_deps()
  sys.meta_path.insert(0, _Finder(root, dict(transforms or {})))
