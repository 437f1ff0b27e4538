"""A converted checkpoint's stored parameter shapes against its config.

Everything here reads orbax metadata only (no tensor), so `load` can refuse
a checkpoint whose config.json disagrees with its tensors (an edited or
mismatched config) in one error, before anything is restored, instead of
failing inside the model's first forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import jax
from flax import traverse_util

from flash_dllm_jax import quantize as quantize_lib
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params

_SHOWN = 4  # mismatches named in the error; the rest are counted


def stored_shapes(checkpointer, group_dir: Path) -> dict[str, tuple]:
  """{param path: shape} of one group, from its orbax metadata alone."""
  meta = checkpointer.metadata(group_dir)
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  return {p: tuple(m.shape) for p, m in
          traverse_util.flatten_dict(dict(tree), sep="/").items()}


def expected_shapes(config: ModelConfig) -> dict[str, tuple]:
  """{param path: shape} of the parameters `config` describes, as stored
  (kernel_q and scale for the weights a quantized config stores 8-bit)."""
  plain = config.replace(quantize=None, quantize_head=False,
                         quantize_embedding=False)
  tree = jax.eval_shape(lambda: init_params(plain, jax.random.key(0)))
  flat = traverse_util.flatten_dict(tree, sep="/")
  if config.quantize is None:
    return {p: tuple(s.shape) for p, s in flat.items()}
  out = {}
  for path, leaf in flat.items():
    leaves = jax.eval_shape(lambda a, path=path: quantize_lib.quantize_leaf(
        config, path, a), leaf)
    out.update({p: tuple(s.shape) for p, s in leaves.items()})
  return out


def _listed(what: str, names: list[str]) -> str:
  more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
  return f"{what} ({len(names)}): {', '.join(names[:_SHOWN])}{more}"


def check_against_config(checkpointer, ckpt_dir: Path,
                         groups: Iterable[str], config: ModelConfig) -> None:
  """A ValueError naming every parameter whose stored name or shape is not
  what config.json implies (missing, unexpected, other shapes)."""
  stored: dict[str, tuple] = {}
  for group in groups:
    stored.update(stored_shapes(checkpointer, ckpt_dir / "params" / group))
  want = expected_shapes(config)
  problems = []
  dims = lambda shape: "x".join(map(str, shape)) or "scalar"
  shapes = [f"{p} is {dims(stored[p])} (config: {dims(want[p])})"
            for p in want if p in stored and stored[p] != want[p]]
  if shapes:
    problems.append(_listed("other shapes", shapes))
  missing = [p for p in want if p not in stored]
  if missing:
    problems.append(_listed("missing", missing))
  extra = [p for p in stored if p not in want]
  if extra:
    problems.append(_listed("unexpected", extra))
  if problems:
    sizes = ", ".join(f"{k} {getattr(config, k)}" for k in (
        "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim",
        "mlp_hidden", "vocab_size"))
    raise ValueError(f"checkpoint {ckpt_dir}: its tensors do not match its "
                     f"config.json ({sizes}): {'; '.join(problems)}")


def check_quantizable(checkpointer, ckpt_dir: Path, groups,
                      config: ModelConfig) -> None:
  """Every kernel to quantize can take config.quantize, from the metadata
  alone."""
  for group in groups:
    for path, shape in stored_shapes(checkpointer,
                                     ckpt_dir / "params" / group).items():
      if quantize_lib.quantizes(config, path):
        quantize_lib.check_leaf(config, path, shape)
