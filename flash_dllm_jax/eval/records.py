"""The run directory: run.json (settings) and records.jsonl (one line per
finished problem), written so that a killed run loses no finished problem.

Records of a batch are appended in one write, flushed and fsynced. On
reopening, a last line cut short by a crash (or not valid JSON) is dropped
and the file truncated back to the last complete record; a bad line
anywhere else is an error, not silently skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import jax


class RecordStore:
  """records: {problem id: record} of what the JSONL already holds."""

  def __init__(self, path: str | Path):
    self.path = Path(path)
    self.records: dict[str, dict[str, Any]] = {}
    if self.path.exists():
      self._load()

  def _load(self) -> None:
    data = self.path.read_bytes()
    offset, good_end = 0, 0
    pieces = data.split(b"\n")
    last = max((i for i, p in enumerate(pieces) if p.strip()), default=-1)
    for i, piece in enumerate(pieces):
      offset += len(piece) + 1
      if not piece.strip():
        continue
      try:
        record = json.loads(piece)
        if not isinstance(record, dict) or not isinstance(record.get("id"),
                                                          str):
          raise ValueError("not a record")
      except ValueError:
        if i != last:
          raise ValueError(f"{self.path}:{i + 1}: corrupt record in the middle "
                           "of the file; fix or delete it to resume") from None
        print(f"warning: {self.path}:{i + 1}: dropping an incomplete last "
              "line (the run was interrupted while writing it)",
              file=sys.stderr)
        break
      self.records[record["id"]] = record
      good_end = min(offset, len(data))
    if good_end != len(data) or (data and not data.endswith(b"\n")):
      with open(self.path, "r+b") as f:
        f.truncate(good_end)
        if good_end and not data[:good_end].endswith(b"\n"):
          f.seek(0, os.SEEK_END)
          f.write(b"\n")

  def append(self, records: Iterable[dict[str, Any]]) -> None:
    """Adds records durably (one write, flush, fsync)."""
    records = list(records)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    for r in records:
      self.records[r["id"]] = r


def open_run(run_dir: str | Path, settings: dict[str, Any],
             records_name: str = "records.jsonl") -> RecordStore:
  """Creates run_dir with run.json, or checks that an existing run was
  started with the same settings (a resume must not mix configurations).
  Several processes may open one run at once (each with its own
  records_name)."""
  run_dir = Path(run_dir)
  meta = run_dir / "run.json"
  settings = json.loads(json.dumps(settings))  # tuples -> lists, as stored
  if meta.exists():
    old = json.loads(meta.read_text())
    if old != settings:
      keys = sorted(k for k in set(old) | set(settings)
                    if old.get(k) != settings.get(k))
      diffs = "; ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}"
                        for k in keys)
      raise ValueError(f"run directory {run_dir} was started with other "
                       f"settings ({diffs}); choose another --run-name")
  else:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = meta.with_suffix(f".{os.getpid()}.{os.urandom(4).hex()}.tmp")
    tmp.write_text(json.dumps(settings, indent=2))
    os.replace(tmp, meta)
  return RecordStore(run_dir / records_name)


def shard_name(index: int, count: int) -> str:
  """The records file of process `index` of `count` in a multi-process run."""
  return f"records.{index}-of-{count}.jsonl"


def merge_shards(run_dir: str | Path, count: int) -> RecordStore:
  """Appends to run_dir/records.jsonl every record of the `count` process
  shards it lacks (shard files are kept, so merging twice adds nothing)."""
  run_dir = Path(run_dir)
  merged = RecordStore(run_dir / "records.jsonl")
  for index in range(count):
    path = run_dir / shard_name(index, count)
    if path.exists():
      merged.append(r for r in RecordStore(path).records.values()
                    if r["id"] not in merged.records)
  return merged


def peak_memory_bytes() -> int | None:
  """The first local device's peak bytes in use so far (None where the
  backend keeps no memory stats, e.g. the CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")
