"""Loading a checkpoint directory: converted (checkpoint_files.py gives its
layout and writes it), a Hugging Face directory of a registered family
(convert/streaming.py), or a family's own format (Architecture.loader).
Groups are restored one at a time, so host memory stays near one group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy bfloat16)
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.sharding import NamedSharding

from flash_dllm_jax import architectures, parallel, quantize as quantize_lib
from flash_dllm_jax import roles
from flash_dllm_jax.checkpoint_files import (FORMAT, Params,  # noqa: F401
                                             family_loader, placed,
                                             quantized_config, save,
                                             staging_dir)
from flash_dllm_jax.checkpoint_shapes import (check_against_config,
                                              check_quantizable, stored_shapes)
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert.streaming import hf_config, is_hf_dir, load_hf
from flash_dllm_jax.model import fuse
from flash_dllm_jax.tokenizer import Tokenizer


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
  if is_hf_dir(ckpt_dir):
    return "hf"
  raise FileNotFoundError(
      f"{ckpt_dir} is neither a converted checkpoint (it has no "
      f"manifest.json) nor a Hugging Face directory of {_families()} "
      "(config.json with model.safetensors or model.safetensors.index.json)")


def _families() -> str:
  """The registry's families, for messages."""
  return "a family: " + ", ".join(architectures.names())


def load_config(ckpt_dir: str | Path) -> ModelConfig:
  """The ModelConfig of a checkpoint directory (converted or Hugging Face),
  without loading weights (a family's own format: its config)."""
  ckpt_dir = Path(ckpt_dir)
  own = family_loader(ckpt_dir)
  if own is not None:
    return own.load_config(ckpt_dir)
  if _kind(ckpt_dir) == "hf":
    return hf_config(ckpt_dir)
  config = _read_json(ckpt_dir / "config.json", "the model config")
  config.pop("model_type", None)
  return ModelConfig.from_dict(config)


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
  if fuse_qkv is None:
    fuse_qkv = fuse.joins_by_default()
  if fuse_qkv:
    params, config = fuse.fuse_qkv(params, config)
  return params, config, tokenizer
