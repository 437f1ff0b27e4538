"""Run summaries, the markdown table and the accuracy/throughput plot.

Metric definitions (per run, over its problems):
  score: accuracy (GSM8K) or pass@1 (HumanEval), the fraction correct.
  tokens: generated tokens up to and including the first EOS/EOT; prompt
    and anything after the stop token excluded.
  tokens_per_s: tokens / decode seconds, where decode seconds are the
    batches' wall times (host work included) minus JAX compile time.
  forwards_per_token: model forward passes / tokens.
  tokens_per_step: tokens / decoding steps, each row counting the steps it
    ran itself (a row stops once its answer is complete).
  peak_device_bytes: the device's peak_bytes_in_use from jax memory_stats
    (None where the backend has none, e.g. CPU).
  undecodable: problems whose prompt could not be decoded (recorded with
    their error; they count as wrong in the score).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

TABLE = "results.md"
PLOT = "accuracy_vs_throughput.png"


def summarize(records: Sequence[dict], *, task: str, metric: str,
              settings: dict, limit: int | None, run_name: str) -> dict:
  """The run's summary from its per-problem records."""
  n = len(records)
  batches = {r["batch"]: r for r in records if r["batch"] is not None}
  wall = sum(b["wall_s"] for b in batches.values())
  compile_s = sum(b["compile_s"] for b in batches.values())
  decode_s = wall - compile_s
  tokens = sum(r["tokens"] for r in records)
  forwards = sum(r["forwards"] for r in records)
  steps = sum(r["steps"] for r in records)
  peaks = [r["peak_device_bytes"] for r in records
           if r.get("peak_device_bytes") is not None]
  correct = sum(bool(r["correct"]) for r in records)
  return {
      "task": task, "metric": metric, "run_name": run_name,
      "strategy": settings.get("strategy"), "problems": n, "limit": limit,
      "correct": correct, "score": correct / n if n else None,
      "undecodable": sum("error" in r for r in records),
      "generated_tokens": tokens, "forwards": forwards, "steps": steps,
      "batches": len(batches), "wall_s": wall, "compile_s": compile_s,
      "decode_s": decode_s,
      "tokens_per_s": tokens / decode_s if decode_s > 0 else None,
      "forwards_per_token": forwards / tokens if tokens else None,
      "tokens_per_step": tokens / steps if steps else None,
      "peak_device_bytes": max(peaks) if peaks else None,
      "settings": settings}


def write_summary(path: str | Path, summary: dict) -> None:
  path = Path(path)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(summary, indent=2))
  os.replace(tmp, path)


def collect(out_dir: str | Path) -> list[dict]:
  """The summaries of every run under out_dir (out_dir/*/summary.json)."""
  out = []
  for path in sorted(Path(out_dir).glob("*/summary.json")):
    try:
      out.append(json.loads(path.read_text()))
    except ValueError:
      print(f"warning: skipping unreadable {path}", file=sys.stderr)
  return out


def _num(x: float | None, fmt: str) -> str:
  return "-" if x is None else format(x, fmt)


def markdown_table(summaries: Sequence[dict]) -> str:
  """One row per run: score, throughput, efficiency and the main settings."""
  metrics = {s["metric"] for s in summaries}
  header = metrics.pop() if len(metrics) == 1 else "accuracy / pass@1"
  cols = ["task", "run", "strategy", "n", header, "tok/s", "fwd/tok",
          "tok/step", "peak mem", "gen len", "block", "steps", "chat",
          "shots", "batch", "device"]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  no_mem = False
  for s in summaries:
    st, sampler = s["settings"], s["settings"].get("sampler", {})
    peak = s["peak_device_bytes"]
    no_mem |= peak is None
    mem = "n/a*" if peak is None else f"{peak / 2**30:.2f} GiB"
    score = "-" if s["score"] is None else f"{100 * s['score']:.1f}%"
    row = [s["task"], s["run_name"], str(s["strategy"]), str(s["problems"]),
           score, _num(s["tokens_per_s"], ".1f"),
           _num(s["forwards_per_token"], ".3f"),
           _num(s["tokens_per_step"], ".2f"), mem,
           str(sampler.get("gen_length", "-")),
           str(sampler.get("block_length", "-")),
           str(sampler.get("steps", "-")), "yes" if st.get("chat") else "no",
           str(st.get("num_fewshot", "-")), str(st.get("batch_size", "-")),
           str(s.get("device", "-"))]
    lines.append("| " + " | ".join(row) + " |")
  notes = ["", "tok/s: generated tokens (up to and including EOS) per second "
           "of generate wall time (host work included, JAX compilation "
           "excluded)."]
  if no_mem:
    notes.append("\\* n/a: the backend reports no device memory statistics "
                 "(jax memory_stats is None, e.g. on CPU).")
  return "\n".join(lines + notes) + "\n"


def plot(summaries: Sequence[dict], path: str | Path) -> None:
  """Score against tokens per second, one point per run, a panel per task."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tasks = sorted({s["task"] for s in summaries})
  fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5),
                           squeeze=False)
  for ax, task in zip(axes[0], tasks):
    runs = [s for s in summaries if s["task"] == task
            and s["tokens_per_s"] is not None and s["score"] is not None]
    for s in runs:
      ax.scatter([s["tokens_per_s"]], [100 * s["score"]], s=40,
                 label=s["run_name"])
    metric = runs[0]["metric"] if runs else "score"
    top = max([100 * s["score"] for s in runs] + [1.0])
    right = max([s["tokens_per_s"] for s in runs] + [1.0])
    ax.set_ylim(-0.03 * top, min(102, 1.15 * top))
    ax.set_xlim(0, 1.1 * right)
    ax.set(title=f"{task}: {metric} vs throughput",
           xlabel="generated tokens / s (compile excluded)",
           ylabel=f"{metric} (%)")
    ax.grid(alpha=0.3)
    if runs:
      ax.legend(fontsize=8, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(out_dir: str | Path) -> tuple[Path, Path, str]:
  """Writes out_dir/results.md and the plot over every run in out_dir;
  returns (table path, plot path, table text)."""
  out_dir = Path(out_dir)
  summaries = collect(out_dir)
  if not summaries:
    raise FileNotFoundError(f"no run summaries (*/summary.json) in {out_dir}")
  table = markdown_table(summaries)
  (out_dir / TABLE).write_text(table)
  plot(summaries, out_dir / PLOT)
  return out_dir / TABLE, out_dir / PLOT, table
