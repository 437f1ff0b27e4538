"""Training checkpoints: resumable states and the exported model.

OUT/checkpoints/step_<8 digits>/ holds
  model/       a checkpoint `flash_dllm_jax.load` reads (float32 master
               params, the compute-dtype config, the tokenizer)
  optimizer/   the optax state's leaves as one orbax item
  state.json   {"step": N}
Each is written into a staging directory and renamed when complete, so a
crash never leaves a half checkpoint that resume would pick up.
The exported model (`export_model`) is the plain checkpoint with params
cast to bfloat16: the shipped format, as `scripts/convert_hf.py` writes
(DiffusionGemma: Google's format, models.save_model).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from flash_dllm_jax.checkpoint import load, staging_dir
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.tokenizer import Tokenizer
from flash_dllm_train.models import save_model

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def checkpoint_dir(out_dir: str | Path, step: int) -> Path:
  return Path(out_dir) / "checkpoints" / f"step_{step:08d}"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
  """Complete training checkpoints under OUT/checkpoints, oldest first."""
  root = Path(out_dir) / "checkpoints"
  if not root.is_dir():
    return []
  found = []
  for path in root.iterdir():
    match = _STEP_DIR.match(path.name)
    if match and (path / "state.json").is_file():
      found.append((int(match.group(1)), path))
  return sorted(found)


def save_checkpoint(out_dir: str | Path, step: int, params, opt_state,
                    config: ModelConfig, tokenizer: Tokenizer | None,
                    keep: int = 2) -> Path:
  """Writes the checkpoint of `step` and deletes all but the newest `keep`."""
  dst = checkpoint_dir(out_dir, step)
  leaves = jax.device_get(jax.tree.leaves(opt_state))
  with staging_dir(dst, force=True) as tmp:
    save_model(tmp / "model", params, config, tokenizer)
    tree = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
    ocp.PyTreeCheckpointer().save((tmp / "optimizer").absolute(),
                                  args=ocp.args.PyTreeSave(tree))
    (tmp / "state.json").write_text(json.dumps({"step": step}) + "\n")
  for _, old in list_checkpoints(out_dir)[:-keep] if keep > 0 else []:
    shutil.rmtree(old, ignore_errors=True)
  return dst


def restore_checkpoint(path: str | Path, opt_state_like: Any,
                       ) -> tuple[int, Any, Any, ModelConfig, Tokenizer | None]:
  """(step, params, opt_state, config, tokenizer) of a training checkpoint;
  `opt_state_like` (optimizer.init of same-shaped params) gives the tree."""
  path = Path(path).absolute()
  step = json.loads((path / "state.json").read_text())["step"]
  # Unfused, as training built them (load joins q/k/v on a GPU).
  params, config, tokenizer = load(path / "model", fuse_qkv=False)
  treedef = jax.tree.structure(opt_state_like)
  like = jax.tree.leaves(opt_state_like)
  tree = ocp.PyTreeCheckpointer().restore(path / "optimizer")
  if len(tree) != len(like):
    raise ValueError(f"{path}: optimizer state has {len(tree)} leaves, the "
                     f"optimizer expects {len(like)} (different settings?)")
  leaves = [jnp.asarray(tree[f"leaf_{i:05d}"], dtype=x.dtype)
            for i, x in enumerate(like)]
  for got, want in zip(leaves, like):
    if got.shape != want.shape:
      raise ValueError(f"{path}: optimizer state shapes differ from the "
                       "model's (different model size?)")
  return step, params, jax.tree.unflatten(treedef, leaves), config, tokenizer


def export_model(dst: str | Path, params, config: ModelConfig,
                 tokenizer: Tokenizer | None, dtype: str = "bfloat16",
                 force: bool = True) -> int:
  """Saves the model with params cast to `dtype` (config.dtype set to it);
  returns the size of the directory in bytes."""
  cast = jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)
  save_model(dst, cast, config.replace(dtype=dtype), tokenizer, force=force)
  return sum(f.stat().st_size for f in Path(dst).rglob("*") if f.is_file())
