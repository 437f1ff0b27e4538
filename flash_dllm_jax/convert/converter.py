"""Hugging Face safetensors (any registered architecture) -> a
flash_dllm_jax checkpoint.

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
import logging
import math
import os
import re
import resource
import shutil
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from flash_dllm_jax import architectures, checkpoint_files
from flash_dllm_jax import quantize as quantized
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import source
from flash_dllm_jax.convert.source import ConversionError
from flash_dllm_jax.convert.tables import Mapped

_COPIED_FILES = ("generation_config.json", "added_tokens.json")


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
  A family with its own checkpoint format (Architecture.loader with a
  `convert`) converts through it.
  Returns the ModelConfig that was written (that family's config). Raises ConversionError before
  touching `dst_dir` if anything is wrong with the source.
  """
  src, dst = Path(src_dir), Path(dst_dir)
  if dst.exists() and not force:
    raise ConversionError(f"destination {dst} already exists; pass "
                          "force=True (--force) to replace it")
  own = checkpoint_files.family_loader(src)
  if own is not None and hasattr(own, "convert"):
    # A family with its own format (DiffusionGemma: Google's orbax tree).
    if quantize is not None or quantize_head or quantize_embedding:
      raise ConversionError(f"{src}: 8-bit conversion is not supported for "
                            "this family")
    try:
      own.convert(src, dst, dtype=dtype, force=force)
      return own.load_config(dst)
    except (ValueError, KeyError) as e:
      raise ConversionError(str(e)) from None
  model_type, config, tokenizer = source.read_model(src, dtype)
  headers = source.read_headers(src)
  plan = source.plan_tensors(
      headers, architectures.get(config.arch).name_table(), config, model_type)
  try:
    config = checkpoint_files.quantized_config(config, quantize, quantize_head,
                                         str(src),
                                         embedding=quantize_embedding)
    if quantize is not None:
      source.check_quantizable(plan, config)
  except ValueError as e:
    raise ConversionError(str(e)) from None
  np_dtype = np.dtype(dtype)
  groups = _split_groups(plan, np_dtype.itemsize, max_group_bytes)

  stacks = source.Stacks()
  with tqdm(total=sum(map(len, plan.values())), unit="tensor",
            desc="converting", disable=not progress) as bar, \
       _write_errors(dst), checkpoint_files.staging_dir(dst, force) as tmp:
    written = {}
    for group, (shard, mapped) in groups.items():
      arrays = {}
      for m in mapped:
        complete = stacks.add(m, source.read_tensor(src / shard, m, config,
                                                    np_dtype))
        for path, array in complete.items():
          if quantize is not None:
            arrays.update({p: np.asarray(a) for p, a in
                           quantized.quantize_leaf(config, path,
                                                   array).items()})
          else:
            arrays[path] = array
        bar.update()
      if arrays:  # expert slices wait for the group completing their stack
        checkpoint_files.write_group(tmp, group, arrays)
        written[group] = sorted(arrays)
    checkpoint_files.write_metadata(tmp, config, written, tokenizer, model_type)
    for name in _COPIED_FILES:
      if (src / name).is_file():
        shutil.copyfile(src / name, tmp / name)
  if progress:
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    parts = ["projections"] + ["LM head"] * quantize_head + [
        "embedding"] * quantize_embedding
    as_ = dtype + (f", {', '.join(parts)} in {quantize}" if quantize else "")
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


