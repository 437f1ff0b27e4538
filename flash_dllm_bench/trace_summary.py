"""Where a traced program's device time goes: kernels from a perfetto trace.

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes
`perfetto_trace.json.gz`; on a GPU its device processes ("/device:GPU:N")
hold one thread per CUDA stream with one complete ("X") event per kernel or
copy, plus derived lines ("XLA Ops", "XLA Modules") that repeat the same time
and are skipped here. XLA:GPU copies a while loop's predicate to the host
once per iteration, so device-to-host copies split the loop into steps.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import statistics
from pathlib import Path
from typing import NamedTuple

# First match wins; names as cuBLAS, cuDNN, XLA and this project's Pallas
# kernels (pallas_kernels/*/kernel.py `name=`) give them.
CATEGORIES = (
    ("collective", re.compile(r"nccl|all-?reduce|all-?gather|all-?to-?all|"
                              r"reduce-?scatter|collective|psum", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
    ("attention", re.compile(r"scheduled_attention|flash|fmha|cudnn", re.I)),
    ("rope+cache write", re.compile(r"rope_cache_write")),
    ("rms norm", re.compile(r"rms_norm")),
    ("token prob", re.compile(r"token_logprob|token_prob")),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|gemv|matmul|dot",
                        re.I)),
    ("scatter/gather", re.compile(r"scatter|gather|dynamic.update|"
                                  r"dynamic.slice", re.I)),
    ("reduction", re.compile(r"reduce|reduction|argmax|sort|topk", re.I)),
    ("elementwise fusion", re.compile(r"fusion|loop_|input_", re.I)),
)
_DERIVED_LINES = re.compile(r"XLA Ops|XLA Modules|Steps|TraceMe|Framework",
                            re.I)
_TO_HOST = re.compile(r"memcpy.*(dtoh|d2h|device.?to.?host)", re.I)


class Kernel(NamedTuple):
  name: str
  start_us: float
  dur_us: float
  stream: str


def category(name: str) -> str:
  for label, pattern in CATEGORIES:
    if pattern.search(name):
      return label
  return "other"


def load_events(path: Path | str) -> list[dict]:
  path = Path(path)
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def find_trace(log_dir: Path | str) -> Path:
  found = sorted(Path(log_dir).glob("**/perfetto_trace.json.gz"))
  if not found:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir}")
  return found[-1]


def device_kernels(events: list[dict]) -> tuple[list[Kernel], dict]:
  """Kernels and copies on device streams, in start order, and the
  {process: [thread names]} seen (to show what was kept)."""
  procs = {e["pid"]: e.get("args", {}).get("name", "")
           for e in events if e.get("ph") == "M"
           and e.get("name") == "process_name"}
  threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "")
             for e in events if e.get("ph") == "M"
             and e.get("name") == "thread_name"}
  device_pids = {p for p, name in procs.items() if "/device:" in name}
  seen = collections.defaultdict(set)
  kernels = []
  for e in events:
    if e.get("ph") != "X" or e.get("pid") not in device_pids:
      continue
    thread = threads.get((e["pid"], e.get("tid")), str(e.get("tid")))
    seen[procs[e["pid"]]].add(thread)
    if _DERIVED_LINES.search(thread):
      continue
    kernels.append(Kernel(e.get("name", "?"), float(e.get("ts", 0.0)),
                          float(e.get("dur", 0.0)), thread))
  kernels.sort(key=lambda k: k.start_us)
  return kernels, {p: sorted(t) for p, t in seen.items()}


def split_steps(kernels: list[Kernel]) -> list[list[Kernel]]:
  """Kernels grouped by loop iteration, cut after each device-to-host copy
  (the while loop's predicate). One group if there is no such copy."""
  steps, current = [], []
  for k in kernels:
    current.append(k)
    if _TO_HOST.search(k.name):
      steps.append(current)
      current = []
  if current:
    steps.append(current)
  return steps


class Summary(NamedTuple):
  """Device milliseconds: by category and by kernel name (each with calls),
  the whole trace's span and busy time, and per-step busy times."""

  by_category: dict[str, tuple[float, int]]
  by_kernel: dict[str, tuple[float, int]]
  span_ms: float
  busy_ms: float
  step_busy_ms: list[float]


def summarize(kernels: list[Kernel]) -> Summary:
  by_cat, by_name = collections.defaultdict(lambda: [0.0, 0]), \
      collections.defaultdict(lambda: [0.0, 0])
  for k in kernels:
    for table, key in ((by_cat, category(k.name)), (by_name, k.name)):
      table[key][0] += k.dur_us / 1e3
      table[key][1] += 1
  span = ((max(k.start_us + k.dur_us for k in kernels)
           - min(k.start_us for k in kernels)) / 1e3) if kernels else 0.0
  steps = [sum(k.dur_us for k in group) / 1e3
           for group in split_steps(kernels)]
  order = lambda t: dict(sorted(((n, tuple(v)) for n, v in t.items()),
                                key=lambda kv: -kv[1][0]))
  return Summary(order(by_cat), order(by_name), span,
                 sum(k.dur_us for k in kernels) / 1e3, steps)


def report(summary: Summary, steps: int, top: int = 25,
           exclude_first: bool = False) -> str:
  """A markdown report: categories and the top kernels in ms per step.

  steps: loop steps the trace holds (to divide totals by). exclude_first:
  also give the per-step busy time without the first iteration (a prefill).
  """
  s, lines = summary, []
  per = max(steps, 1)
  lines.append(f"trace: {s.span_ms:.1f} ms span, {s.busy_ms:.1f} ms of "
               f"kernels ({s.busy_ms / per:.2f} ms per step over {steps} "
               f"steps); {len(s.step_busy_ms)} device-to-host cuts")
  if len(s.step_busy_ms) > 2:
    rest = s.step_busy_ms[1:-1] if exclude_first else s.step_busy_ms[:-1]
    lines.append(f"per cut: first {s.step_busy_ms[0]:.2f} ms, median of the "
                 f"{'rest' if exclude_first else 'all'} "
                 f"{statistics.median(rest):.2f} ms, min {min(rest):.2f}, "
                 f"max {max(rest):.2f}, last {s.step_busy_ms[-1]:.2f}")
  lines += ["", "| category | ms per step | share | calls per step |",
            "|---|---|---|---|"]
  for name, (ms, calls) in s.by_category.items():
    lines.append(f"| {name} | {ms / per:.3f} | {ms / max(s.busy_ms, 1e-9):.1%}"
                 f" | {calls / per:.1f} |")
  lines += ["", "| kernel | category | ms per step | share | calls per step |",
            "|---|---|---|---|---|"]
  for name, (ms, calls) in list(s.by_kernel.items())[:top]:
    short = name if len(name) < 90 else name[:87] + "..."
    lines.append(f"| `{short}` | {category(name)} | {ms / per:.3f} | "
                 f"{ms / max(s.busy_ms, 1e-9):.1%} | {calls / per:.1f} |")
  return "\n".join(lines)
