"""Compares the answers of two evaluation output directories run by run.

  python scripts/compare_runs.py RUNS_A RUNS_B

Each directory holds run subdirectories (`eval_quality.py --out-dir`, or
`python -m flash_dllm_jax.eval --out-dir`), each with records.jsonl. For
every run name present in both, prints how many problems have the same
output text and lists the ids that differ; exits 1 if any run differs. Used
to check that the mesh shape (or the batch) does not change the tokens.
--fields compares those record fields instead, e.g. `--fields token_ids
steps forwards`: the whole decode, not only the text up to EOS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def outputs(run_dir: Path, fields=("output",)) -> dict[str, list]:
  """{problem id: [its record's fields]} of one run directory."""
  rows = (json.loads(line) for line in
          (run_dir / "records.jsonl").read_text().splitlines() if line.strip())
  try:
    return {r["id"]: [r[f] for f in fields] for r in rows}
  except KeyError as e:
    raise SystemExit(f"{run_dir}: records have no field {e}") from None


def compare(a: Path, b: Path, fields=("output",)
            ) -> list[tuple[str, int, int, list[str]]]:
  """(run name, problems in both, identical, differing ids) per shared run."""
  runs = sorted(p.name for p in a.iterdir() if (p / "records.jsonl").exists()
                and (b / p.name / "records.jsonl").exists())
  if not runs:
    raise SystemExit(f"no run directory with records.jsonl in both {a} "
                     f"and {b}")
  table = []
  for name in runs:
    ra, rb = outputs(a / name, fields), outputs(b / name, fields)
    shared = sorted(set(ra) & set(rb))
    differ = [i for i in shared if ra[i] != rb[i]]
    table.append((name, len(shared), len(shared) - len(differ), differ))
  return table


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("a", type=Path)
  ap.add_argument("b", type=Path)
  ap.add_argument("--fields", nargs="+", default=["output"],
                  help="record fields that must agree (default: output)")
  args = ap.parse_args(argv)
  table = compare(args.a, args.b, tuple(args.fields))
  for name, n, same, differ in table:
    print(f"{name}: {same}/{n} identical" +
          (f"; differ: {' '.join(differ[:20])}" if differ else ""))
  return int(any(differ for *_, differ in table))


if __name__ == "__main__":
  sys.exit(main())
