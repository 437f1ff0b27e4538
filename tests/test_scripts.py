"""The benchmark scripts run end to end on a tiny model (no timing claims)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["bench_forward.py", "bench_strategies.py"])
def test_bench_script_smoke(script, tmp_path):
  out = tmp_path / "result.json"
  result = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / script), "--smoke", "--json",
       str(out)], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "| " in result.stdout and out.exists()
