"""Markdown tables for BENCHMARKS.md from bench_kernels.py JSON files.

One table per op (rows in file order) and a tally of the kernel targets:
kernel >= 1.5x the best XLA composition, and >= 70% of the copy bandwidth
measured in the same process where the op is memory-bound.

  python scripts/bench_report.py benchmarks/results/kernels/2026-11-30-h200/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_dllm_bench.kernel_bench import tuning_table  # noqa: E402

COLS = ("shape", "kernel µs", "best XLA µs", "speedup", "GB/s", "× copy BW",
        "TFLOP/s", "× roofline", "bound", "max err", "XLA path")


def row_cells(r: dict) -> list[str]:
  return [r["shape"], f"{r['kernel_us']:.1f}", f"{r['xla_us']:.1f}",
          f"{r['speedup']:.2f}", f"{r['gb_s']:.0f}", f"{r['frac_copy_bw']:.2f}",
          f"{r['tflop_s']:.1f}", f"{r['frac_roofline']:.2f}", r["bound"],
          f"{r['max_err']:.2g}", r["note"].removeprefix("xla=") or "-"]


def report(paths: list[Path]) -> str:
  by_op: dict[str, list[dict]] = {}
  seen, tuning, ceilings = set(), {}, []
  for path in paths:
    data = json.loads(path.read_text())
    ceilings.append(f"{path.name}: copy {data['copy_gb_s']:.0f} GB/s, "
                    f"matmul {data['matmul_tflop_s']:.0f} TFLOP/s")
    for r in data["rows"]:
      if (r["op"], r["shape"]) not in seen:  # first measurement wins
        seen.add((r["op"], r["shape"]))
        by_op.setdefault(r["op"], []).append(r)
    for op, shapes in data.get("tuning", {}).items():
      tuning.setdefault(op, {}).update(shapes)
  out = ["Ceilings measured by each process: " + "; ".join(ceilings) + ".",
         ""]
  for op, rows in by_op.items():
    fast = sum(r["speedup"] >= 1.5 for r in rows)
    mem = [r for r in rows if r["bound"] == "mem"]
    bw = sum(r["frac_copy_bw"] >= 0.7 for r in mem)
    out += [f"**{op}** ({len(rows)} shapes): ≥ 1.5× XLA on {fast}; "
            f"memory-bound on {len(mem)}, of which ≥ 70% of copy bandwidth "
            f"on {bw}; speedup {min(r['speedup'] for r in rows):.2f}–"
            f"{max(r['speedup'] for r in rows):.2f}×.", "",
            "| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    out += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    out.append("")
  if tuning:
    out += ["Tiling sweep (`--tune`):", "", tuning_table(tuning), ""]
  return "\n".join(out)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("json", type=Path, nargs="+")
  print(report(ap.parse_args(argv).json))


if __name__ == "__main__":
  main()
