"""scripts/bench_serve.py --smoke --cold-start runs end to end and writes
its JSON and plot."""

import json
import subprocess
import sys

import pytest

from tests.paths import ROOT


@pytest.mark.slow
def test_bench_serve_smoke(tmp_path):
  out = tmp_path / "serve.json"
  run = subprocess.run([sys.executable, "scripts/bench_serve.py", "--smoke",
                        "--cold-start", "--json-schema", "1", "--out",
                        str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["offline_tokens_per_s"] > 0 and result["alone_latency_s"] > 0
  assert [r["offered_rps"] for r in result["loads"]] == [8, float("inf")]
  fits = result["burst_fitting_slots"]  # as many requests as slots at once
  assert fits["requests"] == result["slots"] == 4
  assert fits["ttft_alone_same_prompts_p50_s"] > 0  # the burst's own baseline
  assert fits["ttft_p50_vs_same_prompts_alone"] > 0
  assert fits["ttft_vs_alone_per_request_p50"] > 0
  for row in result["loads"] + [fits]:
    assert row["requests"] in (4, 8) and row["tokens_per_s"] > 0
    assert 0 < row["ttft_p50_s"] <= row["latency_p99_s"]
    assert 0 < row["round_trips_per_token"] and row["loaded_per_round_trip"] > 0
    assert row["host_gap_mean_s"] > 0 and row["admission_latency_mean_s"] >= 0
    assert row["ttft_p50_vs_alone"] > 0 and row["latency_p50_vs_alone"] > 0
    assert 0 <= row["ttft_p50_less_queueing_vs_alone"] <= row[
        "ttft_p50_vs_alone"]
    cpu = row["server_cpu_ms_per_request"]  # the host's cost, by thread
    assert set(cpu) == {"process", "http", "engine"} and cpu["http"] > 0
    assert cpu["engine"] > 0 and cpu["process"] >= cpu["http"]
  assert "targets: saturation" in run.stdout
  for start in ("cold", "warm"):
    assert 0 < result["cold_start"][start]["compile_s"] <= result[
        "cold_start"][start]["process_s"]
  assert result["compile_s"] > 0
  assert "peak_gb" in result  # the device's peak (None: the CPU keeps none)
  schema = result["json_schema"]
  assert schema["requests"] == 1 and schema["json_tokens_per_step"] > 0
  assert schema["host_ms_per_step"] > 0 and "JSON schema" in run.stdout
  assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
  assert "tok/s" in run.stdout and "wrote" in run.stdout


def test_the_spawned_client_reports_a_failed_load():
  """The GPU benchmark's clients run in a spawned process (client_pool(False),
  importing no JAX): a load that cannot connect comes back as one readable
  error (aiohttp's own exceptions do not pickle back)."""
  import socket
  from flash_dllm_bench.serve_load import client_pool, load_in_child
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed once the block ends
  pool = client_pool(False)
  try:
    with pytest.raises(RuntimeError, match="the load failed"):
      load_in_child(pool, f"http://127.0.0.1:{port}", "m", [[1, 2]],
                    float("inf"), 0)
  finally:
    pool.shutdown()
