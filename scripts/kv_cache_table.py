"""The 8-bit KV cache table from bench_strategies.py JSON files: each row's
steady ms/step, tokens/s, roofline, KV cache and peak memory, and its
ratios to the baseline row measured in the same run (the bf16-cache row).

  python scripts/kv_cache_table.py BASELINE.json ROWS.json [ROWS.json ...]

Prints a markdown table; --json writes the rows with their ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_rows(path: Path) -> list[dict]:
  """The rows of one bench_strategies.py --json file, each with its
  weights' format (none: bf16); [] for a run that wrote no file."""
  if not path.exists():
    return []
  doc = json.loads(path.read_text())
  weights = doc.get("quantize") or "bf16"
  return [dict(r, weights=weights) for r in doc["rows"]]


def with_ratios(rows: list[dict], base: dict) -> list[dict]:
  """rows with peak / base peak and steady step / base steady step (the
  step time where no steady one was measured)."""
  ms = lambda r: r.get("steady_ms_step") or r["ms_step"]
  out = []
  for r in rows:
    ratio = lambda a, b: None if a is None or not b else a / b
    out.append(dict(r, step_ms=ms(r), peak_ratio=ratio(r["peak_gb"],
                                                        base["peak_gb"]),
                    step_ratio=ms(r) / ms(base),
                    tokens_s_ratio=r["tokens_s"] / base["tokens_s"]))
  return out


def table(rows: list[dict]) -> str:
  fmt = lambda x, f: "–" if x is None else format(x, f)
  lines = ["| strategy | weights | KV cache | batch | steady ms/step | "
           "roofline ms/step | roofline / steady | tokens/s | KV cache GB | "
           "peak GB | peak / baseline | ms/step / baseline | "
           "tokens/s / baseline |", "|" + "---|" * 13]
  for r in rows:
    lines.append(
        f"| {r['strategy']} | {r['weights']} | {r['kv_cache_dtype']} | "
        f"{r['batch']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | "
        f"{r['floor_ms'] / r['step_ms']:.0%} | {r['tokens_s']:.0f} | "
        f"{r['cache_gb']:.1f} | {fmt(r['peak_gb'], '.2f')} | "
        f"{fmt(r['peak_ratio'], '.2f')} | {r['step_ratio']:.2f} | "
        f"{r['tokens_s_ratio']:.2f} |")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("baseline", type=Path,
                  help="the run whose first row is the baseline")
  ap.add_argument("rows", type=Path, nargs="+")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)
  base = load_rows(args.baseline)
  if not base:
    sys.exit(f"no baseline row in {args.baseline}")
  rows = base + [r for p in args.rows for r in load_rows(p)]
  rows = with_ratios(rows, base[0])
  print(table(rows))
  if args.json:
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
