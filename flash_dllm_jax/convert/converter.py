"""Hugging Face LLaDA / Dream safetensors -> a flash_dllm_jax checkpoint.

Everything that can be wrong with the source (files, headers, names, shapes)
is checked from the safetensors headers before a single tensor is read. The
tensors are then streamed, one at a time, into one orbax group per shard (or
per bounded part of a shard) inside a temporary directory that is renamed to
DST only at the end: host memory stays near one group, and no half-written
DST is ever left behind. A destination that cannot be written (read-only,
full, no permission) is one ConversionError naming DST and the cause.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import resource
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

import ml_dtypes  # noqa: F401  (lets safetensors hand out bfloat16 numpy)
import numpy as np
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from flash_dllm_jax import architectures, checkpoint
from flash_dllm_jax import quantize as quantized
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert.tables import Mapped, expected_names, resolve
from flash_dllm_jax.tokenizer import Tokenizer

_COPIED_FILES = ("generation_config.json", "added_tokens.json")
_FLOAT_DTYPES = ("F32", "F16", "BF16")
Headers = dict[str, dict[str, tuple[tuple[int, ...], str]]]


class ConversionError(ValueError):
  """The source cannot be converted; the message names every problem found."""


def convert_checkpoint(src_dir: str | Path, dst_dir: str | Path,
                       dtype: str = "bfloat16", force: bool = False,
                       progress: bool = True,
                       max_group_bytes: int = 1 << 30,
                       quantize: str | None = None,
                       quantize_head: bool = False,
                       quantize_embedding: bool = False) -> ModelConfig:
  """Converts the HF checkpoint in `src_dir` into a new directory `dst_dir`
  (replaced only with `force`, and only once the conversion has succeeded).

  Params are cast to `dtype` and written one orbax group per source shard
  (split into parts of at most `max_group_bytes`, which bounds host memory).
  quantize (a format of flash_dllm_jax/quantize.py; quantize_head: the LM
  head too, quantize_embedding: the token embedding too): each projection
  is quantized as it is read and stored as kernel_q and scale; the config
  records the format.
  Returns the ModelConfig that was written. Raises ConversionError before
  touching `dst_dir` if anything is wrong with the source.
  """
  src, dst = Path(src_dir), Path(dst_dir)
  if dst.exists() and not force:
    raise ConversionError(f"destination {dst} already exists; pass "
                          "force=True (--force) to replace it")
  model_type, config, tokenizer = _read_model(src, dtype)
  headers = _read_headers(src)
  plan = _plan(headers, architectures.get(config.arch).name_table(), config,
               model_type)
  try:
    config = checkpoint.quantized_config(config, quantize, quantize_head,
                                         str(src),
                                         embedding=quantize_embedding)
    if quantize is not None:
      check_quantizable(plan, config)
  except ValueError as e:
    raise ConversionError(str(e)) from None
  np_dtype = np.dtype(dtype)
  groups = _split_groups(plan, np_dtype.itemsize, max_group_bytes)

  with tqdm(total=sum(map(len, plan.values())), unit="tensor",
            desc="converting", disable=not progress) as bar, \
       _write_errors(dst), checkpoint.staging_dir(dst, force) as tmp:
    written = {}
    for group, (shard, mapped) in groups.items():
      arrays = {}
      for m in mapped:
        array = _read_tensor(src / shard, m, np_dtype)
        if quantize is not None:
          arrays.update({p: np.asarray(a) for p, a in quantized.quantize_leaf(
              m.param_path, array, quantize, quantize_head,
              quantize_embedding).items()})
        else:
          arrays[m.param_path] = array
        bar.update()
      checkpoint.write_group(tmp, group, arrays)
      written[group] = sorted(arrays)
    checkpoint.write_metadata(tmp, config, written, tokenizer, model_type)
    for name in _COPIED_FILES:
      if (src / name).is_file():
        shutil.copyfile(src / name, tmp / name)
  if progress:
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    as_ = dtype + (f", projections in {quantize}" if quantize else "")
    print(f"wrote {dst} ({config.num_params():,} params as {as_}); "
          f"peak host memory {peak_mib:,.0f} MiB")
  return config


@contextlib.contextmanager
def _write_errors(dst: Path) -> Iterator[None]:
  """Turns a failure to write DST (read-only or full file system, no
  permission) into one ConversionError naming DST and the cause. Orbax
  reports a failed write as a ValueError and also logs it, with tracebacks,
  from its writer threads: those logs are held back here."""
  absl_logger = logging.getLogger("absl")
  level, hook = absl_logger.level, sys.unraisablehook
  absl_logger.setLevel(logging.CRITICAL)
  # After a failed write, tensorstore's callbacks still try orbax's closed
  # event loops (each printing a traceback), some after this returns: on a
  # failure the filter stays.
  if hook is not _quiet_closed_loops:
    _quiet_closed_loops.default = hook
    sys.unraisablehook = _quiet_closed_loops
  try:
    yield
  except OSError as e:
    raise ConversionError(f"cannot write {dst}: {_cause(e)}") from None
  except ValueError as e:
    if isinstance(e, ConversionError) or not _STATUS.match(str(e)):
      raise
    raise ConversionError(f"cannot write {dst}: {_cause(e)}") from None
  else:
    sys.unraisablehook = hook
  finally:
    absl_logger.setLevel(level)


def _quiet_closed_loops(unraisable) -> None:
  """sys.unraisablehook dropping only RuntimeError('Event loop is closed')."""
  e = unraisable.exc_value
  if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
    _quiet_closed_loops.default(unraisable)


# How tensorstore (under orbax) words a failed write: an absl status first.
_STATUS = re.compile(r"(RESOURCE_EXHAUSTED|PERMISSION_DENIED|UNAVAILABLE|"
                     r"FAILED_PRECONDITION|INTERNAL|UNKNOWN|NOT_FOUND): ")


def _cause(e: Exception) -> str:
  """The OS error behind e ('No space left on device'), else its first
  line."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  code = re.search(r"os_error_code='(\d+)'", str(e))
  if code:
    return os.strerror(int(code.group(1)))
  return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _split_groups(plan: dict[str, list[Mapped]], itemsize: int,
                  max_bytes: int) -> dict[str, tuple[str, list[Mapped]]]:
  """{group name: (shard, tensors)}: a group per shard, named after it, or
  parts '<shard>.partK' of at most max_bytes (one tensor at least) each."""
  groups = {}
  for shard, mapped in plan.items():
    parts, size = [[]], 0
    for m in mapped:
      nbytes = math.prod(m.expected_shape) * itemsize
      if parts[-1] and size + nbytes > max_bytes:
        parts, size = parts + [[]], 0
      parts[-1].append(m)
      size += nbytes
    stem = shard.removesuffix(".safetensors")
    for k, part in enumerate(parts):
      groups[stem if len(parts) == 1 else f"{stem}.part{k}"] = (shard, part)
  return groups


def _read_tensor(shard: Path, mapped: Mapped, dtype: np.dtype) -> np.ndarray:
  """One tensor in our layout and dtype. The shard is mapped per tensor so
  that only this tensor's pages, not the whole shard's, stay resident."""
  try:
    with safe_open(str(shard), framework="numpy") as f:
      hf_array = f.get_tensor(mapped.hf_name)
  except SafetensorError as e:
    raise ConversionError(f"cannot read {mapped.hf_name} from {shard}: "
                          f"{e}") from None
  return np.asarray(mapped.rule.apply(hf_array), dtype, order="C")


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
  if not path.is_file():
    if required:
      raise ConversionError(f"{path.parent} has no {path.name}")
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{path} is not valid JSON: {e}") from None


def _read_model(src: Path, dtype: str
                ) -> tuple[str, ModelConfig, Tokenizer]:
  """model_type, ModelConfig and tokenizer of the source directory."""
  if not src.is_dir():
    raise ConversionError(f"source directory {src} does not exist")
  hf = _read_json(src / "config.json", required=True)
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
        generation_config=_read_json(src / "generation_config.json", False))
  except ValueError as e:
    raise ConversionError(f"{src}/config.json: {e}") from None
  if tokenizer.vocab_size > config.vocab_size:
    raise ConversionError(f"the tokenizer has {tokenizer.vocab_size} ids but "
                          f"the model only {config.vocab_size} embedding rows")
  return model_type, config, tokenizer


def _read_headers(src: Path) -> Headers:
  """{shard file: {tensor name: (shape, dtype)}} read from the headers only."""
  index = _read_json(src / "model.safetensors.index.json", required=False)
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
      shape = m.expected_shape
      if m.rule.transform == "transpose":
        shape = shape[::-1]
      if quantized.quantizes(m.param_path, config.quantize_head,
                             config.quantize_embedding):
        quantized.check_leaf(config.quantize, m.param_path, shape)


def _plan(headers: Headers, table, config: ModelConfig,
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
      if mapped.param_path in found:
        problems.append(f"{name} and {found[mapped.param_path]} both map to "
                        f"{mapped.param_path}")
      found[mapped.param_path] = name
      if shape != mapped.expected_shape:
        problems.append(f"shape mismatch: {name} has shape {shape}, expected "
                        f"{mapped.expected_shape}")
      if dtype not in _FLOAT_DTYPES:
        problems.append(f"{name} has dtype {dtype}, expected one of "
                        f"{_FLOAT_DTYPES}")
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
