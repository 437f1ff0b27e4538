"""benchmarks/<topic>.sh and BENCHMARKS.md point at things that exist: every
entry is valid bash and names scripts of this tree, and every raw-results
path the tables cite is in benchmarks/results/."""

import glob
import itertools
import re
import subprocess

import pytest

from tests.paths import ROOT

ENTRIES = sorted((ROOT / "benchmarks").glob("*.sh"))
TOPICS = ("forward", "kernels", "strategies", "quality", "training",
          "continuous", "batch-invariance", "multi-gpu", "quantized")


def _braces(path):
  """'a.{json,log}' -> ['a.json', 'a.log'] (every brace group expanded)."""
  parts = re.split(r"\{([^}]*)\}", path)
  options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
  return ["".join(c) for c in itertools.product(*options)]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda p: p.name)
def test_entry_is_valid_bash_calling_existing_scripts(entry):
  result = subprocess.run(["bash", "-n", str(entry)], capture_output=True,
                          text=True)
  assert result.returncode == 0, result.stderr
  called = re.findall(r"\b((?:scripts|tools)/[\w/]+\.py)\b", entry.read_text())
  assert called or entry.name == "common.sh"
  missing = [c for c in called if not (ROOT / c).is_file()]
  assert not missing, f"{entry.name} calls {missing}"


def test_every_cited_raw_result_exists():
  text = (ROOT / "BENCHMARKS.md").read_text()
  cited = re.findall(r"`((?:%s)/[^`]+)`" % "|".join(TOPICS), text)
  assert len(cited) >= 10
  results = ROOT / "benchmarks" / "results"
  missing = [p for c in cited for p in _braces(c)
             if not glob.glob(str(results / p))]
  assert not missing, missing
  for topic in TOPICS:
    assert (results / topic).is_dir(), topic
