"""The profile summary reads device kernels from a perfetto trace."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flash_dllm_bench import trace_summary

ROOT = Path(__file__).resolve().parents[1]


def _gpu_trace(tmp_path):
  """Two loop iterations on one stream, each cut by the predicate's copy to
  the host, plus a derived "XLA Ops" line and a host thread to be skipped."""
  meta = [
      dict(ph="M", name="process_name", pid=1, args=dict(name="/host:CPU")),
      dict(ph="M", name="process_name", pid=2,
           args=dict(name="/device:GPU:0")),
      dict(ph="M", name="thread_name", pid=1, tid=10, args=dict(name="python")),
      dict(ph="M", name="thread_name", pid=2, tid=20,
           args=dict(name="Stream #13(Compute)")),
      dict(ph="M", name="thread_name", pid=2, tid=21, args=dict(name="XLA Ops")),
  ]
  x = lambda pid, tid, ts, dur, name: dict(ph="X", pid=pid, tid=tid, ts=ts,
                                           dur=dur, name=name)
  kernels = [
      x(2, 20, 0, 1000, "sm90_xmma_gemm_bf16bf16_bf16f32"),   # prefill
      x(2, 20, 1000, 200, "scheduled_attention"),
      x(2, 20, 1200, 5, "MemcpyDtoH"),
      x(2, 20, 1300, 100, "nvjet_tst_128x64"),                # step 2
      x(2, 20, 1400, 50, "loop_multiply_fusion"),
      x(2, 20, 1450, 30, "rope_cache_write"),
      x(2, 20, 1480, 5, "MemcpyDtoH"),
  ]
  skipped = [x(2, 21, 0, 5000, "fusion.1"), x(1, 10, 0, 9000, "PjitFunction")]
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump(dict(traceEvents=meta + kernels + skipped), f)
  return path


def test_summary_counts_stream_kernels_only_and_cuts_at_host_copies(tmp_path):
  kernels, lines = trace_summary.device_kernels(
      trace_summary.load_events(_gpu_trace(tmp_path)))
  assert lines == {"/device:GPU:0": ["Stream #13(Compute)", "XLA Ops"]}
  assert [k.name for k in kernels][:2] == ["sm90_xmma_gemm_bf16bf16_bf16f32",
                                           "scheduled_attention"]
  s = trace_summary.summarize(kernels)
  assert s.busy_ms == pytest.approx(1.39)
  assert s.span_ms == pytest.approx(1.485)
  assert s.step_busy_ms == pytest.approx([1.205, 0.185])
  assert s.by_category["gemm"] == (pytest.approx(1.1), 2)
  assert s.by_category["attention"] == (pytest.approx(0.2), 1)
  assert s.by_category["copy"] == (pytest.approx(0.01), 2)
  assert s.by_category["rope+cache write"][1] == 1
  assert s.by_category["elementwise fusion"][1] == 1
  assert list(s.by_category)[0] == "gemm"  # largest first
  text = trace_summary.report(s, steps=2, exclude_first=True)
  assert "| gemm | 0.550 |" in text and "`scheduled_attention`" in text


def test_find_trace_names_the_directory_when_empty(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    trace_summary.find_trace(tmp_path)


def test_profile_step_script_smoke(tmp_path):
  """Runs on the tiny model, two strategies (on a CPU the trace has no
  device lines; the script still reports the step counts and writes one
  report per strategy)."""
  result = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "profile_step.py"), "--smoke",
       "--only", "flash-dllm", "flash-dllm-onepass",
       "--out-dir", str(tmp_path), "--keep-trace"],
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  report = (tmp_path / "profile.md").read_text()
  assert report.count("4 loop steps") == 2 and "| category |" in report
  assert "## flash-dllm-onepass, batch 2" in report
  for name in ("flash-dllm", "flash-dllm-onepass"):
    assert (tmp_path / f"{name}-b2-g32.perfetto.json.gz").exists()
