"""The benchmark scripts run end to end on a tiny model (no timing claims)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_bench_kernels_smoke_with_tuning(tmp_path):
  """Rows carry the roofline columns; --tune times 2 tilings per kernel
  shape (interpret mode) and records default and best."""
  import json
  out = tmp_path / "kernels.json"
  result = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), str(out),
       "--smoke", "--tune", "--tune-limit", "2"],
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  data = json.loads(out.read_text())
  assert data["matmul_tflop_s"] > 0
  for r in data["rows"]:
    assert r["bound"] in ("mem", "flop") and r["roofline_us"] > 0
    assert (r["flops"] > 0) == (r["op"] != "rope_cache_write")
  assert set(data["tuning"]) == {"attention", "attention+mass", "matmul"}
  assert len(data["tuning"]["attention"]) == 2
  assert len(data["tuning"]["matmul"]) == 6  # M=300 is left to XLA
  for shapes in data["tuning"].values():
    for t in shapes.values():
      assert len(t["all"]) == 2 and t["best"]["us"] <= t["default"]["us"]
      assert "block_k" in t["best"] or "block_n" in t["best"]


def test_bench_params_match_init_params_in_shape_dtype_and_scale():
  import jax
  import jax.numpy as jnp
  from flash_dllm_jax.bench.timing import bench_params
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.model import init_params
  config = ModelConfig.tiny("llada", dtype="bfloat16")
  fast, slow = bench_params(config, pool=1 << 10), init_params(
      config, jax.random.key(0))
  assert jax.tree.structure(fast) == jax.tree.structure(slow)
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(slow)):
    assert a.shape == b.shape and a.dtype == b.dtype
    a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
    assert bool(jnp.all(jnp.isfinite(a32)))
    # Same spread (ones for norm scales) within sampling noise.
    np.testing.assert_allclose(float(jnp.std(a32)), float(jnp.std(b32)),
                               rtol=0.2, atol=1e-6)
  # Same-shaped weights (every layer's) are not copies of one another.
  q = [x for x in jax.tree.leaves(fast) if x.ndim == 2
       and x.shape == (config.d_model, config.d_model)]
  assert len(q) >= 2 and not bool(jnp.array_equal(q[0], q[1]))
