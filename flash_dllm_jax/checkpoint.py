"""Checkpoint directories: parameters in orbax groups, config and tokenizer.

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
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy bfloat16)
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.sharding import NamedSharding

from flash_dllm_jax import parallel, quantize as quantize_lib, roles
from flash_dllm_jax.checkpoint_shapes import (check_against_config,
                                              check_quantizable, stored_shapes)
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


def _read_json(path: Path, what: str) -> dict[str, Any]:
  if not path.is_file():
    raise FileNotFoundError(f"checkpoint {path.parent} lacks {path.name} "
                            f"({what})")
  return json.loads(path.read_text())


def _kind(ckpt_dir: Path) -> str:
  """'converted' (manifest.json), 'hf' (config.json + safetensors), or a
  FileNotFoundError that says what the directory lacks."""
  if ckpt_dir.exists() and not ckpt_dir.is_dir():
    raise FileNotFoundError(f"checkpoint {ckpt_dir} is a file; a checkpoint "
                            "is a directory (converted, or a Hugging Face "
                            f"directory of {_families()})")
  if not ckpt_dir.is_dir():
    raise FileNotFoundError(f"checkpoint directory {ckpt_dir} does not exist")
  if (ckpt_dir / "manifest.json").is_file():
    return "converted"
  from flash_dllm_jax.convert.streaming import is_hf_dir
  if is_hf_dir(ckpt_dir):
    return "hf"
  raise FileNotFoundError(
      f"{ckpt_dir} is neither a converted checkpoint (it has no "
      f"manifest.json) nor a Hugging Face directory of {_families()} "
      "(config.json with model.safetensors or model.safetensors.index.json)")


def _families() -> str:
  """The registry's families, for messages."""
  from flash_dllm_jax import architectures
  return "a family: " + ", ".join(architectures.names())


def family_loader(ckpt_dir: str | Path):
  """The loader module of the architecture whose own checkpoint format
  `ckpt_dir` is in (Architecture.loader), or None."""
  from flash_dllm_jax import architectures
  for spec in architectures.ARCHITECTURES.values():
    if spec.loader is not None and spec.loader().claims(ckpt_dir):
      return spec.loader()
  return None


def load_config(ckpt_dir: str | Path) -> ModelConfig:
  """The ModelConfig of a checkpoint directory (converted or Hugging Face),
  without loading weights (a family's own format: its config)."""
  ckpt_dir = Path(ckpt_dir)
  own = family_loader(ckpt_dir)
  if own is not None:
    return own.load_config(ckpt_dir)
  if _kind(ckpt_dir) == "hf":
    from flash_dllm_jax.convert.streaming import hf_config
    return hf_config(ckpt_dir)
  config = _read_json(ckpt_dir / "config.json", "the model config")
  config.pop("model_type", None)
  return ModelConfig.from_dict(config)


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


def load(ckpt_dir: str | Path, dtype: str | None = None, mesh=None,
         quantize: str | None = None, quantize_head: bool = False,
         quantize_embedding: bool = False, fuse_qkv: bool | None = None,
         ) -> tuple[Params, ModelConfig, Tokenizer | None]:
  """Restores (params, config, tokenizer) from a checkpoint directory.

  Params come back as jax arrays in their stored dtype, or cast to `dtype`
  (then config.dtype is set to it as well). Groups are restored one by one.
  mesh ('data=D,model=M' or a Mesh): each weight is read shard by shard
  straight onto its devices with its `parallel.param_spec` sharding (no
  device, and no host buffer, ever holds a whole sharded weight).
  A family's own format (Architecture.loader: Google's DiffusionGemma
  orbax tree) loads through that family's loader, which returns its own
  config. A Hugging Face directory of a registered family loads too, tensor by tensor through
  the converter's name table and checks (convert/streaming.py; dtype
  default bfloat16), with nothing written to disk.
  quantize (a format of flash_dllm_jax/quantize.py; quantize_head: the LM
  head too, quantize_embedding: the token embedding too): a bf16/float32
  checkpoint is quantized as it loads, on device, each group (HF: each
  tensor) as soon as it is read, so device memory stays near the 8-bit
  weights plus one group. A checkpoint stored quantized loads as stored
  (its config says so); `dtype` never applies to its 8-bit kernels and
  their scales.
  fuse_qkv: join each layer's q/k/v projections into one (model/fuse.py);
  None does so on a GPU, where the one GEMM is faster at few rows.
  """
  ckpt_dir = Path(ckpt_dir).absolute()
  own = family_loader(ckpt_dir)
  if own is not None:
    return own.load(ckpt_dir, dtype=dtype, mesh=mesh, quantize=quantize,
                    quantize_head=quantize_head,
                    quantize_embedding=quantize_embedding, fuse_qkv=fuse_qkv)
  if _kind(ckpt_dir) == "hf":
    from flash_dllm_jax.convert.streaming import load_hf
    return _fused(*load_hf(ckpt_dir, dtype=dtype, mesh=mesh,
                           quantize=quantize, quantize_head=quantize_head,
                           quantize_embedding=quantize_embedding),
                  fuse_qkv)
  stored = load_config(ckpt_dir)
  config = quantized_config(stored, quantize, quantize_head, str(ckpt_dir),
                            embedding=quantize_embedding)
  fmt = config.quantize if stored.quantize is None else None
  manifest = _read_json(ckpt_dir / "manifest.json", "the parameter manifest")
  if manifest.get("format") != FORMAT:
    raise ValueError(f"{ckpt_dir}: unsupported checkpoint format "
                     f"{manifest.get('format')!r} (expected {FORMAT})")
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  mesh = parallel.parse_mesh(mesh)
  parallel.check_config(config, mesh)
  checkpointer = ocp.PyTreeCheckpointer()
  for group in manifest["groups"]:
    if not (ckpt_dir / "params" / group).is_dir():
      raise FileNotFoundError(f"checkpoint {ckpt_dir} lacks parameter group "
                              f"params/{group}")
  check_against_config(checkpointer, ckpt_dir, manifest["groups"], stored)
  if fmt is not None:
    check_quantizable(checkpointer, ckpt_dir, manifest["groups"], config)
  # 8-bit kernels and their scales keep their stored dtypes, float32
  # parameters (a router) theirs.
  cast = lambda p: None if np_dtype is None else roles.stored_dtype(
      stored, p, np_dtype)
  flat: dict[str, jax.Array] = {}
  for group, paths in manifest["groups"].items():
    group_dir = ckpt_dir / "params" / group
    if mesh is None:
      args = {p: ocp.RestoreArgs(restore_type=np.ndarray, dtype=cast(p))
              for p in paths}
    else:
      shapes = stored_shapes(checkpointer, group_dir)
      args = {p: ocp.ArrayRestoreArgs(
          dtype=cast(p), sharding=NamedSharding(
              mesh, parallel.param_spec(stored, p, shapes[p], mesh)))
          for p in paths}
    restore_args = traverse_util.unflatten_dict(args, sep="/")
    tree = checkpointer.restore(
        group_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    for path, array in traverse_util.flatten_dict(tree, sep="/").items():
      array = array if mesh is not None else jnp.asarray(array)
      if fmt is None:
        flat[path] = array
        continue
      for new_path, new in quantize_lib.quantize_leaf(config, path,
                                                      array).items():
        flat[new_path] = placed(config, new_path, new, mesh)
      del array
    del tree
  tokenizer = None
  if manifest.get("tokenizer"):
    if not (ckpt_dir / "tokenizer.json").is_file():
      raise FileNotFoundError(f"checkpoint {ckpt_dir} lacks tokenizer.json")
    tokenizer = Tokenizer.from_dir(ckpt_dir)
  if dtype is not None:
    config = config.replace(dtype=dtype)
  return _fused(traverse_util.unflatten_dict(flat, sep="/"), config,
                tokenizer, fuse_qkv)


def _fused(params, config, tokenizer, fuse_qkv):
  from flash_dllm_jax.model import fuse
  if fuse_qkv is None:
    fuse_qkv = fuse.joins_by_default()
  if fuse_qkv:
    params, config = fuse.fuse_qkv(params, config)
  return params, config, tokenizer
