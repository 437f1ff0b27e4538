"""scripts/kv_cache_table.py: the 8-bit KV cache rows against the baseline
row of the same run (bench_strategies.py --json files)."""

import importlib.util
import json

from tests.paths import ROOT


def _module():
  spec = importlib.util.spec_from_file_location(
      "kv_cache_table", ROOT / "scripts" / "kv_cache_table.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _row(kv, batch, steady, peak):
  return dict(strategy="flash-dllm", kernels="", batch=batch, prompt=768,
              gen=512, kv_cache_dtype=kv, ms_step=steady + 10.0,
              steady_ms_step=steady, floor_ms=steady / 2,
              tokens_s=batch * 16 / steady * 1e3, cache_gb=batch * 0.34,
              peak_gb=peak)


def test_ratios_to_the_baseline_row(tmp_path, capsys):
  t = _module()
  base, rows = tmp_path / "base.json", tmp_path / "rows.json"
  base.write_text(json.dumps(dict(quantize=None, rows=[
      _row("auto", 32, 100.0, 40.0)])))
  rows.write_text(json.dumps(dict(quantize="fp8", rows=[
      _row("float8_e4m3fn", 128, 300.0, 60.0)])))
  out = tmp_path / "table.json"
  t.main([str(base), str(rows), str(tmp_path / "missing.json"),
          "--json", str(out)])
  got = json.loads(out.read_text())
  assert [r["weights"] for r in got] == ["bf16", "fp8"]
  assert got[1]["peak_ratio"] == 60.0 / 40.0
  assert got[1]["step_ratio"] == 3.0
  assert abs(got[1]["tokens_s_ratio"] - (128 / 300) / (32 / 100)) < 1e-12
  printed = capsys.readouterr().out
  assert "| flash-dllm | fp8 | float8_e4m3fn | 128 | 300.00 |" in printed
  assert "| 1.50 | 3.00 | 1.33 |" in printed
