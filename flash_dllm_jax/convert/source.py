"""What a Hugging Face checkpoint directory holds, checked from its
config, tokenizer and safetensors headers before a single tensor is read:
every problem is one ConversionError naming it. `Stacks` gathers per-expert
tensors into the stacked [X, ...] parameters they fill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (lets safetensors hand out bfloat16 numpy)
import numpy as np
from safetensors import SafetensorError, safe_open

from flash_dllm_jax import architectures, roles
from flash_dllm_jax import quantize as quantized
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert.tables import Mapped, expected_names, resolve
from flash_dllm_jax.tokenizer import Tokenizer

FLOAT_DTYPES = ("F32", "F16", "BF16")
Headers = dict[str, dict[str, tuple[tuple[int, ...], str]]]


class ConversionError(ValueError):
  """The source cannot be converted; the message names every problem found."""


def read_tensor(shard: Path, mapped: Mapped, config: ModelConfig,
                dtype: np.dtype) -> dict[str, np.ndarray]:
  """{param path: array in our layout} of one HF tensor, in `dtype` (or
  float32 where the parameter's role keeps it so). The shard is mapped per
  tensor so that only this tensor's pages, not the whole shard's, stay
  resident."""
  try:
    with safe_open(str(shard), framework="numpy") as f:
      hf_array = f.get_tensor(mapped.hf_name)
  except SafetensorError as e:
    raise ConversionError(f"cannot read {mapped.hf_name} from {shard}: "
                          f"{e}") from None
  return {path: np.asarray(part, roles.stored_dtype(config, path, dtype),
                           order="C")
          for path, part in mapped.apply(hf_array).items()}


class Stacks:
  """Per-expert slices -> the stacked [X, ...] parameters: `add` returns
  the arrays that are complete (a non-expert tensor's at once)."""

  def __init__(self):
    self._open: dict[str, tuple[np.ndarray, int]] = {}

  def add(self, mapped: Mapped, arrays: dict[str, np.ndarray]
          ) -> dict[str, np.ndarray]:
    if mapped.expert is None:
      return arrays
    done = {}
    for path, part in arrays.items():
      stack, filled = self._open.get(path) or (
          np.empty((mapped.n_experts, *part.shape), part.dtype), 0)
      stack[mapped.expert] = part
      if filled + 1 == mapped.n_experts:
        done[path] = stack
        self._open.pop(path, None)
      else:
        self._open[path] = (stack, filled + 1)
    return done


def read_json(path: Path, required: bool) -> dict[str, Any] | None:
  if not path.is_file():
    if required:
      raise ConversionError(f"{path.parent} has no {path.name}")
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{path} is not valid JSON: {e}") from None


def read_model(src: Path, dtype: str
                ) -> tuple[str, ModelConfig, Tokenizer]:
  """model_type, ModelConfig and tokenizer of the source directory."""
  if not src.is_dir():
    raise ConversionError(f"source directory {src} does not exist")
  hf = read_json(src / "config.json", required=True)
  model_type = str(hf.get("model_type"))
  try:
    architectures.for_model_type(hf.get("model_type"))
  except ValueError as e:
    raise ConversionError(f"{src}/config.json: {e}") from None
  try:
    tokenizer = Tokenizer.from_dir(src)
  except Exception as e:  # missing files, bad JSON, inconsistent added ids
    raise ConversionError(f"cannot read the tokenizer in {src}: {e}") from None
  try:
    config = ModelConfig.from_hf_config(
        hf, eot_token_id=tokenizer.eot_id, dtype=dtype,
        generation_config=read_json(src / "generation_config.json", False),
        special_ids=tokenizer.special_ids())
  except architectures.MissingToken as e:
    raise ConversionError(f"the tokenizer in {src}: {e}") from None
  except ValueError as e:
    raise ConversionError(f"{src}/config.json: {e}") from None
  if tokenizer.vocab_size > config.vocab_size:
    raise ConversionError(f"the tokenizer has {tokenizer.vocab_size} ids but "
                          f"the model only {config.vocab_size} embedding rows")
  return model_type, config, tokenizer


def read_headers(src: Path) -> Headers:
  """{shard file: {tensor name: (shape, dtype)}} read from the headers only."""
  index = read_json(src / "model.safetensors.index.json", required=False)
  if index is not None:
    weight_map = index.get("weight_map", {})
    shards = sorted(set(weight_map.values()))
  elif (src / "model.safetensors").is_file():
    weight_map, shards = {}, ["model.safetensors"]
  else:
    raise ConversionError(f"{src} has neither model.safetensors.index.json "
                          "nor model.safetensors")
  missing = [s for s in shards if not (src / s).is_file()]
  if missing:
    raise ConversionError(f"missing shard file(s) listed in {src}/"
                          f"model.safetensors.index.json: {', '.join(missing)}")
  headers, corrupt = {}, []
  for shard in shards:
    try:
      with safe_open(str(src / shard), framework="numpy") as f:
        headers[shard] = {
            name: (tuple(f.get_slice(name).get_shape()),
                   f.get_slice(name).get_dtype()) for name in f.keys()}
    except (SafetensorError, OSError) as e:
      corrupt.append(f"{src / shard}: {e}")
  if corrupt:
    raise ConversionError("truncated or corrupt safetensors shard(s):\n  "
                          + "\n  ".join(corrupt))
  misplaced = [f"{name} (index says {shard})"
               for name, shard in sorted(weight_map.items())
               if name not in headers[shard]]
  if misplaced:
    raise ConversionError("tensors listed in model.safetensors.index.json are "
                          "not in their shard: " + ", ".join(misplaced))
  return headers


def check_quantizable(plan: dict[str, list[Mapped]],
                      config: ModelConfig) -> None:
  """Every kernel to quantize can take config.quantize (a ValueError naming
  the layer and its shape otherwise), before a tensor is read."""
  for mapped in plan.values():
    for m in mapped:
      for path, shape in m.stored_shapes().items():
        if quantized.quantizes(config, path):
          quantized.check_leaf(config, path, shape)


def plan_tensors(headers: Headers, table, config: ModelConfig,
          model_type: str) -> dict[str, list[Mapped]]:
  """Maps every tensor, checking names, duplicates, shapes and dtypes."""
  plan: dict[str, list[Mapped]] = {}
  unmapped, found, problems = [], {}, []
  for shard, tensors in headers.items():
    for name, (shape, dtype) in sorted(tensors.items()):
      mapped = resolve(name, table, config)
      if mapped is None:
        unmapped.append(name)
        continue
      key = (mapped.param_path, mapped.expert)
      if key in found:
        problems.append(f"{name} and {found[key]} both map to "
                        f"{mapped.param_path}")
      found[key] = name
      if shape != mapped.expected_shape:
        problems.append(f"shape mismatch: {name} has shape {shape}, expected "
                        f"{mapped.expected_shape}")
      if dtype not in FLOAT_DTYPES:
        problems.append(f"{name} has dtype {dtype}, expected one of "
                        f"{FLOAT_DTYPES}")
      plan.setdefault(shard, []).append(mapped)
  missing = sorted(set(expected_names(table, config)) - set(found.values()))
  if unmapped or missing:
    what = f"a {model_type} model with {config.n_layers} layers"
    lines = [f"tensor names do not match {what}:"]
    if unmapped:
      lines.append(f"  unmapped tensors ({len(unmapped)}): "
                   + ", ".join(sorted(unmapped)))
    if missing:
      lines.append(f"  missing tensors ({len(missing)}): " + ", ".join(missing))
    raise ConversionError("\n".join(lines))
  if problems:
    raise ConversionError("\n".join(problems))
  return plan
