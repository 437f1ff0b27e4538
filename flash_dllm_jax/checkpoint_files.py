"""Checkpoint directories: their layout, writing one, and what loading one
and converting into one share (checkpoint.py loads, flash_dllm_jax.convert
converts; both import this, it imports neither).

Layout (written by `save` and by `flash_dllm_jax.convert`):
  DIR/config.json       ModelConfig.to_dict() plus "model_type" (the HF
                        source's model_type, or the arch for saved models)
  DIR/manifest.json     {"format": 1, "groups": {group: [param paths]},
                         "tokenizer": bool}
  DIR/params/<group>/   one orbax PyTree item with those parameters
  DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json
Param paths join the Flax tree keys with '/', e.g. 'layers_3/q_proj/kernel'.
Groups are written and restored one at a time, so host memory stays near one
group (a source shard when converting, one layer when saving).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.sharding import NamedSharding

from flash_dllm_jax import architectures, parallel, quantize as quantize_lib
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.tokenizer import Tokenizer

FORMAT = 1
Params = dict[str, Any]


@contextlib.contextmanager
def staging_dir(dst_dir: str | Path, force: bool = False) -> Iterator[Path]:
  """Yields an empty temporary directory next to `dst_dir` that becomes
  `dst_dir` when the block succeeds (an old `dst_dir` is replaced only then,
  and only with `force`); on any error it is deleted and `dst_dir` untouched.
  """
  dst = Path(dst_dir).absolute()
  if dst.exists() and not force:
    raise FileExistsError(f"{dst} already exists (use force to replace it)")
  dst.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
  os.chmod(tmp, 0o755)
  try:
    yield tmp
  except BaseException:
    _remove_settled(tmp)
    raise
  old = None
  if dst.exists():
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.replace(dst, old / dst.name)
  try:
    os.replace(tmp, dst)
  except BaseException:
    if old is not None:
      os.replace(old / dst.name, dst)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def _remove_settled(path: Path, quiet_s: float = 0.2,
                    limit_s: float = 5.0) -> None:
  """Deletes `path` until it stays absent for quiet_s (at most limit_s):
  when one of orbax's writes fails (a full disk), its other writes run on
  in tensorstore's threads and recreate their directories after a first
  rmtree."""
  start = time.monotonic()
  gone_since = None
  while time.monotonic() - start < limit_s:
    if path.exists():
      shutil.rmtree(path, ignore_errors=True)
      gone_since = None
    elif gone_since is None:
      gone_since = time.monotonic()
    elif time.monotonic() - gone_since >= quiet_s:
      return
    time.sleep(0.02)


def write_group(ckpt_dir: str | Path, group: str,
                arrays: dict[str, np.ndarray]) -> None:
  """Saves {param path: array} as the orbax item DIR/params/<group>."""
  tree = traverse_util.unflatten_dict(arrays, sep="/")
  path = (Path(ckpt_dir) / "params" / group).absolute()
  ocp.PyTreeCheckpointer().save(path, args=ocp.args.PyTreeSave(tree))


def write_metadata(ckpt_dir: str | Path, config: ModelConfig,
                   groups: dict[str, list[str]], tokenizer: Tokenizer | None,
                   model_type: str | None = None) -> None:
  """Writes config.json, manifest.json and the tokenizer files."""
  ckpt_dir = Path(ckpt_dir)
  config_json = {**config.to_dict(), "model_type": model_type or config.arch}
  manifest = {"format": FORMAT, "groups": groups,
              "tokenizer": tokenizer is not None}
  (ckpt_dir / "config.json").write_text(json.dumps(config_json, indent=2))
  (ckpt_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
  if tokenizer is not None:
    tokenizer.save(ckpt_dir)


def save(dst_dir: str | Path, params: Params, config: ModelConfig,
         tokenizer: Tokenizer | None = None, force: bool = False) -> None:
  """Saves a parameter tree (as `init_params` returns it), one group per
  top-level key, into a new checkpoint directory `dst_dir`."""
  flat = traverse_util.flatten_dict(dict(params), sep="/")
  groups: dict[str, list[str]] = {}
  for path in flat:
    groups.setdefault(path.split("/")[0], []).append(path)
  with staging_dir(dst_dir, force) as tmp:
    for group, paths in groups.items():
      write_group(tmp, group, {p: np.asarray(jax.device_get(flat[p]))
                               for p in paths})
    write_metadata(tmp, config, groups, tokenizer)


def family_loader(ckpt_dir: str | Path):
  """The loader module of the architecture whose own checkpoint format
  `ckpt_dir` is in (Architecture.loader), or None."""
  for spec in architectures.ARCHITECTURES.values():
    if spec.loader is not None and spec.loader().claims(ckpt_dir):
      return spec.loader()
  return None


def quantized_config(config: ModelConfig, fmt: str | None,
                     head: bool = False, where: str = "the checkpoint", *,
                     embedding: bool = False) -> ModelConfig:
  """The config of `config`'s weights after `load(quantize=fmt)` (head:
  quantize_head, embedding: quantize_embedding): `config` itself when fmt
  is None or what it already stores, the format recorded when a
  bf16/float32 checkpoint gets quantized, and a ValueError when they
  conflict with the format it is stored in."""
  asked = {"quantize_head": head, "quantize_embedding": embedding}
  if fmt is None:
    if head or embedding:
      names = [name for name, on in asked.items() if on]
      raise ValueError(f"{' and '.join(names)} "
                       f"need{'s' * (len(names) == 1)} a quantize format")
    return config
  quantize_lib.get_format(fmt)
  if config.quantize is None:
    return config.replace(quantize=fmt, **asked)
  if (config.quantize, config.quantize_head, config.quantize_embedding) != (
      fmt, head, embedding):
    parts = [what for what, on in (("the LM head", config.quantize_head),
                                   ("the embedding",
                                    config.quantize_embedding)) if on]
    stored = config.quantize + (" with " + " and ".join(parts) if parts
                                else "")
    flags = "".join(f", {name}=True" for name, on in asked.items() if on)
    raise ValueError(f"{where} is stored quantized as {stored}; it cannot "
                     f"be loaded as quantize={fmt!r}{flags} (leave "
                     "quantize unset to load it as stored)")
  return config


def placed(config: ModelConfig, path: str, array, mesh):
  """`config`'s parameter `path` on the device, or on its shards of
  `mesh`."""
  if mesh is None:
    return jax.device_put(array)
  sharding = NamedSharding(mesh, parallel.param_spec(config, path,
                                                     array.shape, mesh))
  return array if getattr(array, "sharding", None) == sharding else (
      jax.device_put(array, sharding))
