"""Compares the answers of two evaluation output directories run by run.

  python scripts/compare_runs.py RUNS_A RUNS_B

Each directory holds run subdirectories (`eval_quality.py --out-dir`, or
`python -m flash_dllm_jax.eval --out-dir`), each with records.jsonl. For
every run name present in both, prints how many problems have the same
output text and lists the ids that differ; exits 1 if any run differs. Used
to check that the mesh shape (or the batch) does not change the tokens.
A run's name ends in a hash of its settings, --limit included; when no name
is in both, runs pair by the name before that hash (one per side), and
problems in both runs are compared.
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
  listed = lambda d: sorted(p.name for p in d.iterdir()
                            if (p / "records.jsonl").exists())
  names_a, names_b = listed(a), listed(b)
  pairs = [(n, n) for n in names_a if n in names_b]
  if not pairs:  # the same strategies run with other settings hashes
    stem = lambda n: n.rsplit("-", 1)[0]
    by_stem = lambda names: {s: [n for n in names if stem(n) == s]
                             for s in map(stem, names)}
    sa, sb = by_stem(names_a), by_stem(names_b)
    pairs = [(sa[s][0], sb[s][0]) for s in sorted(sa)
             if s in sb and len(sa[s]) == len(sb[s]) == 1]
  if not pairs:
    raise SystemExit(f"no run directory with records.jsonl in both {a} "
                     f"and {b}")
  table = []
  for name_a, name_b in pairs:
    ra, rb = outputs(a / name_a, fields), outputs(b / name_b, fields)
    name = name_a if name_a == name_b else f"{name_a} ~ {name_b}"
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
