"""The benchmark scripts run end to end on a tiny model (no timing claims).

Each script's `main` runs in this process: no fresh Python and JAX import
per run, and the programs one run compiles (the tiny model's, the copy and
matmul ceilings) serve the next."""

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(name: str):
  """scripts/`name`.py imported (its smoke runs in this process share
  their compiled programs: same tiny model and shapes)."""
  if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
  return importlib.import_module(name)


def bench_strategies():
  return script("bench_strategies")


def test_bench_forward_smoke(tmp_path, capsys):
  out = tmp_path / "result.json"
  script("bench_forward").main(["--smoke", "--json", str(out)])
  assert "| " in capsys.readouterr().out and out.exists()


def test_bench_strategies_smoke(tmp_path, capsys):
  out = tmp_path / "result.json"
  bench_strategies().main(["--smoke", "--json", str(out)])
  assert "| " in capsys.readouterr().out
  assert json.loads(out.read_text())["rows"]


def test_bench_loglikelihood_smoke_compares_batch_sizes(tmp_path, capsys):
  """ms per request and per copy at two batch sizes, and the same scores
  at both (a row's loss does not depend on its batch on the CPU)."""
  out = tmp_path / "ll.json"
  script("bench_loglikelihood").main(["--smoke", "--json", str(out)])
  stdout = capsys.readouterr().out
  rows = json.loads(out.read_text())["rows"]
  assert [r["batch"] for r in rows] == [1, 4]
  assert [r["forwards"] for r in rows] == [24, 6]
  assert all(r["ms_request"] > 0 and r["ms_copy"] > 0 for r in rows)
  assert [r["max_abs_diff"] for r in rows] == [0.0, 0.0]
  assert "| batch | ms/request |" in stdout


def test_bench_strategies_steady_step_is_measured(tmp_path):
  """--steady decodes a second schedule (twice the tokens per step) and
  reports the time per extra step, without the first step's prefill. The
  first schedule is the smoke's flash-dllm program (compiled once)."""
  out = tmp_path / "steady.json"
  bench_strategies().main(["--smoke", "--steady", "--only", "flash-dllm",
                           "--json", str(out)])
  (row,) = json.loads(out.read_text())["rows"]
  # a difference of two timings: its sign is noise on a shared CPU
  steady = row["steady_ms_step"]
  assert isinstance(steady, float) and math.isfinite(steady)
  # gen 32 at 4 tokens a step: 8 steps, each a draft pass of 8 block_m
  # query tokens, and the verify pass of 2 block_m on the other forwards
  assert row["steps"] == 8 and row["gen"] == 32
  assert row["passes"] == [[64, 8], [16, row["forwards"] - 8]]


def test_bench_moe_smoke_times_both_expert_paths_and_the_step(tmp_path,
                                                              capsys):
  """The routed experts' grouped GEMMs alone by Triton's and Mosaic GPU's
  kernels (their interpret modes here), the MoE layer by the Triton kernel
  at two tilings and by the dense path, and strategy-llada2 and llada2.1
  steps, each with its floor, their ratios printed."""
  out = tmp_path / "moe.json"
  script("bench_moe").main(["--smoke", "--json", str(out), "--tilings",
                            "16,16,16", "32,32,32,2,1", "--strategies",
                            "llada2", "llada2.1", "--gemm", "bf16"])
  stdout = capsys.readouterr().out
  rows = json.loads(out.read_text())["rows"]
  assert [r["kind"] for r in rows] == [
      "grouped gemm triton bf16", "grouped gemm mosaic bf16",
      "moe layer grouped m16 n16 k16 w4 s3",
      "moe layer grouped m32 n32 k32 w2 s1", "moe layer dense",
      "llada2 step", "llada2.1 step"]
  assert "llada2.1 / llada2 ms per step, batch 2: " in stdout
  assert rows[1]["triton_over_this"] == rows[0]["ms"] / rows[1]["ms"]
  assert ("grouped gemm mosaic bf16: Triton ms / its ms, batch 2, "
          "62 tokens, tile_m 64: ") in stdout
  for r in rows:
    assert "error" not in r, r
    assert r["ms"] > 0 and r["floor_ms"] > 0


def test_bench_strategies_fails_when_a_variant_gives_no_row(tmp_path,
                                                          monkeypatch):
  """A variant that raises (an out-of-memory on a GPU, here injected: the
  CPU has no such failure to provoke) leaves the other variants' rows in
  the table and the JSON, and the run exits non-zero naming it."""
  bench = bench_strategies()
  real = bench.timing.time_decode

  def time_decode(*args, implementation=None, **kw):
    if implementation.attention.group_target is None:  # split=32
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
    return real(*args, implementation=implementation, **kw)

  monkeypatch.setattr(bench.timing, "time_decode", time_decode)
  out = tmp_path / "rows.json"
  # "default" (split=auto's grouping): the smoke's flash-dllm program
  with pytest.raises(SystemExit, match="flash-dllm batch 2 split=32"):
    bench.main(["--smoke", "--only", "flash-dllm", "--variants",
                "default", "split=32", "--json", str(out)])
  (row,) = json.loads(out.read_text())["rows"]
  assert row["kernels"] == "default" and row["ms_step"] > 0


def test_bench_strategies_gpu_option_reaches_the_decode_options():
  """--gpu-option adds typed entries to generate.GPU_COMPILER_OPTIONS (the
  dict the decode loops compile with) and rejects anything but xla_gpu_*."""
  bench = bench_strategies()
  from flash_dllm_jax.generate import GPU_COMPILER_OPTIONS as options
  saved = dict(options)
  try:
    bench.main(["--smoke", "--only", "none", "--gpu-option",
                "xla_gpu_enable_cublaslt=true", "--gpu-option",
                "xla_gpu_autotune_level=0"])
    assert options["xla_gpu_enable_cublaslt"] is True
    assert options["xla_gpu_autotune_level"] == 0
  finally:
    options.clear()
    options.update(saved)
  with pytest.raises(SystemExit):
    bench.main(["--smoke", "--gpu-option", "cublaslt=1"])


def test_bench_kernels_smoke_with_tuning(tmp_path):
  """Rows carry the roofline columns; --tune times 2 tilings per kernel
  shape (interpret mode) and records default and best. Matmuls at M=1
  (each epilogue) and M=300 (left to XLA) only."""
  out = tmp_path / "kernels.json"
  script("bench_kernels").main([str(out), "--smoke", "--tune",
                                "--tune-limit", "2", "--ms", "1,300"])
  data = json.loads(out.read_text())
  assert data["matmul_tflop_s"] > 0
  for r in data["rows"]:
    assert r["bound"] in ("mem", "flop") and r["roofline_us"] > 0
    assert (r["flops"] > 0) == (r["op"] != "rope_cache_write")
  assert set(data["tuning"]) == {"attention", "attention+mass", "matmul"}
  assert len(data["tuning"]["attention"]) == 2
  assert len(data["tuning"]["matmul"]) == 3  # M=300 is left to XLA
  assert {r["shape"].split(" M=")[1].split(" ")[0] for r in data["rows"]
          if r["op"] == "matmul"} == {"1", "300"}
  for shapes in data["tuning"].values():
    for t in shapes.values():
      assert len(t["all"]) == 2 and t["best"]["us"] <= t["default"]["us"]
      assert "block_k" in t["best"] or "block_n" in t["best"]


@pytest.mark.slow
def test_bench_kernels_qmatmul_smoke_writes_the_table(tmp_path, capsys):
  """--qmatmul --smoke: every shape has the bf16 baseline and each 8-bit
  format and path, each row against the run's ceilings and bf16's time,
  within bf16 error of its reference; the markdown table has every row."""
  from flash_dllm_bench.qmatmul_bench import VARIANTS
  out, md = tmp_path / "q.json", tmp_path / "q.md"
  script("bench_kernels").main([str(out), "--smoke", "--qmatmul",
                                "--markdown", str(md)])
  data = json.loads(out.read_text())
  assert all(v > 0 for v in data["ceilings"].values())
  rows = data["rows"]
  assert len(rows) == 3 * len(VARIANTS)
  for shape in {r["shape"] for r in rows}:
    got = [(r["format"], r["impl"]) for r in rows if r["shape"] == shape]
    assert got == VARIANTS
  for r in rows:
    assert r["us"] > 0 and r["gb_s"] > 0 and r["tflop_s"] > 0
    assert r["max_err"] < 0.02, r
    assert r["ceiling"] == ("fp8" if r["format"] == "fp8_w8a8" else "bf16")
    bf16 = next(b for b in rows if b["shape"] == r["shape"]
                and b["format"] == "bf16")
    assert abs(r["vs_bf16"] - bf16["us"] / r["us"]) < 1e-6
    assert (r["impl"] in ("pallas", "mosaic")) == bool(r["tried"])
  lines = md.read_text().splitlines()
  assert "fp8 matmul" in lines[0]
  assert sum(line.startswith("| ") for line in lines) == 1 + len(rows)


def test_bench_params_match_init_params_in_shape_dtype_and_scale():
  import jax
  from flash_dllm_bench.timing import bench_params
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.model import init_params
  config = ModelConfig.tiny("llada", dtype="bfloat16")
  # init_params as one program, the statistics in NumPy: no small program
  # compiled per leaf shape and operation
  fast = bench_params(config, pool=1 << 10)
  slow = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
  assert jax.tree.structure(fast) == jax.tree.structure(slow)
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(slow)):
    assert a.shape == b.shape and a.dtype == b.dtype
    a32, b32 = (np.asarray(x).astype(np.float32) for x in (a, b))
    assert np.all(np.isfinite(a32))
    # Same spread (ones for norm scales) within sampling noise.
    np.testing.assert_allclose(float(np.std(a32)), float(np.std(b32)),
                               rtol=0.2, atol=1e-6)
  # Same-shaped weights (every layer's) are not copies of one another.
  q = [np.asarray(x) for x in jax.tree.leaves(fast) if x.ndim == 2
       and x.shape == (config.d_model, config.d_model)]
  assert len(q) >= 2 and not np.array_equal(q[0], q[1])


def test_bench_report_tallies_the_targets(tmp_path):
  """bench_report counts >= 1.5x and >= 70% of copy bandwidth (memory-bound
  rows only) per op; a shape measured twice keeps its first row."""
  report = script("bench_report").report

  def row(op, shape, speedup, frac, bound="mem"):
    return dict(op=op, shape=shape, kernel_us=10.0, xla_us=10.0 * speedup,
                speedup=speedup, gb_s=frac * 3000, frac_copy_bw=frac,
                tflop_s=1.0, frac_roofline=frac, bound=bound, max_err=0.0,
                note="xla=cudnn")

  a, b = tmp_path / "a.json", tmp_path / "b.json"
  a.write_text(json.dumps(dict(copy_gb_s=3000, matmul_tflop_s=600, rows=[
      row("attention", "s1", 2.0, 0.8), row("attention", "s2", 1.2, 0.9),
      row("attention", "s3", 1.6, 0.1, bound="flop")])))
  b.write_text(json.dumps(dict(copy_gb_s=3100, matmul_tflop_s=610, rows=[
      row("attention", "s1", 0.5, 0.1), row("matmul", "m1", 1.5, 0.7)])))
  text = report([a, b])
  assert ("**attention** (3 shapes): ≥ 1.5× XLA on 2; memory-bound on 2, "
          "of which ≥ 70% of copy bandwidth on 2; speedup 1.20–2.00×.") in text
  assert "**matmul** (1 shapes): ≥ 1.5× XLA on 1" in text
  assert "| s1 | 10.0 | 20.0 | 2.00 |" in text and "| 5.0 |" not in text


def test_bench_kernels_skip_done_lists_only_unmeasured_shapes(tmp_path,
                                                             capsys):
  out = tmp_path / "cache.json"
  bench = script("bench_kernels")
  bench.main([str(out), "--smoke", "--ops", "cache"])
  rows = json.loads(out.read_text())["rows"]
  assert len(rows) == 2 and {r["op"] for r in rows} == {"rope_cache_write"}
  capsys.readouterr()
  bench.main([str(tmp_path / "x.json"), "--smoke", "--ops", "cache,matmul",
              "--list", "--skip-done", str(out)])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines and all(line.startswith("matmul ") for line in lines)


def test_bench_continuous_runs_and_checks_the_answers(tmp_path):
  """Static batches and continuous batching through the same slots give the
  same answers; the continuous run is one generate call. Four problems whose
  chat prompts share one prompt bucket on the tiny tokenizer, so every way
  decodes them all through its slots (one program per way: static batches
  of 2 and 2, continuous batching refilling 2 slots)."""
  from tests.paths import TINY_CHECKPOINT
  out = tmp_path / "continuous.json"
  lines = (ROOT / "data" / "synthetic_gsm" / "test.jsonl").read_text(
      ).splitlines()
  data = tmp_path / "problems.jsonl"
  data.write_text("".join(lines[i] + "\n" for i in (0, 2, 3, 4)))
  script("bench_continuous").main([
      "--checkpoint", str(TINY_CHECKPOINT), "--data", str(data),
      "--problems", "4", "--slots", "2", "--gen-length", "16",
      "--max-refills", "1", "--json", str(out)])
  data = json.loads(out.read_text())
  ways = data["ways"]
  assert data["same_answers"] and ways["continuous"]["calls"] == 1
  assert ways["static"]["calls"] == 2
  assert ways["continuous, max_refills 1"]["calls"] == 1
  assert 0 < ways["continuous"]["occupancy"] <= 1


def test_compare_runs_reports_identical_and_differing_answers(tmp_path,
                                                              capsys):
  compare_runs = script("compare_runs")
  for side, outs in (("a", ["x", "y", "z"]), ("b", ["x", "Y", "z"])):
    run = tmp_path / side / "flash-dllm"
    run.mkdir(parents=True)
    (run / "records.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "output": o}) + "\n"
        for i, o in enumerate(outs)))
  (tmp_path / "b" / "only-b").mkdir()
  assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
  assert "flash-dllm: 2/3 identical; differ: p1" in capsys.readouterr().out
  assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "a")]) == 0


def test_compare_runs_fields_compare_the_whole_decode(tmp_path, capsys):
  """Same text, another step count: equal by default, different under
  --fields output steps; a missing field is one clear error."""
  compare_runs = script("compare_runs")
  for side, steps in (("a", [3, 4]), ("b", [3, 5])):
    run = tmp_path / side / "flash-cache"
    run.mkdir(parents=True)
    (run / "records.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "output": "x", "steps": s}) + "\n"
        for i, s in enumerate(steps)))
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  assert compare_runs.main([a, b]) == 0
  assert compare_runs.main([a, b, "--fields", "output", "steps"]) == 1
  assert "flash-cache: 1/2 identical; differ: p1" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="no field 'token_ids'"):
    compare_runs.main([a, b, "--fields", "token_ids"])


def test_compare_runs_pairs_runs_of_other_settings_by_strategy(tmp_path,
                                                               capsys):
  """--limit 64 against --limit 128: other settings hashes, the same
  strategies; the problems in both runs are compared."""
  compare_runs = script("compare_runs")
  for side, name, n in (("a", "llada-d3c4b276", 4), ("b", "llada-d1b7bfc5", 2),
                        ("a", "flash-dllm-fce5543f", 4),
                        ("b", "flash-dllm-4a990630", 2)):
    run = tmp_path / side / name
    run.mkdir(parents=True)
    (run / "records.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "output": "x"}) + "\n" for i in range(n)))
  assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
  out = capsys.readouterr().out
  assert "llada-d3c4b276 ~ llada-d1b7bfc5: 2/2 identical" in out
  assert "flash-dllm-fce5543f ~ flash-dllm-4a990630: 2/2 identical" in out


def _reference_forward_kinds(prompt, gen, block, sub_block, cached):
  """(whole, sub) forwards of the restated reference loop
  (tests/fast_dllm_v2_reference.py) over all-zero logits, counted by kind:
  its whole-block denoise forwards, stores and a boundary prompt's prefill
  (the sampler's first step) whole; its sub-block forwards sub."""
  import torch

  from tests.fast_dllm_v2_reference import generate
  calls = {"window": 0, "sub": 0}
  zeros = lambda w: np.zeros((w, 8), np.float32)

  def window_fn(x):
    calls["window"] += 1
    return zeros(len(x)), [(torch.zeros(1, 1, len(x), 1),) * 2]

  def sub_fn(kv, ids, first):
    calls["sub"] += 1
    return zeros(len(ids)), [(torch.zeros(1, 1, len(ids), 1),) * 2]

  out = generate(lambda x: np.zeros((*x.shape, 8), np.float32), [1] * prompt,
                 100, (), gen, block, sub_block, 1.0, cached, window_fn,
                 sub_fn)  # mask id 100: outside the 8 logits
  if cached:
    assert out.denoise == calls["window"] + calls["sub"]
  denoise = calls["window"] if cached else out.denoise
  return (denoise + out.store + (prompt % block == 0), calls["sub"])


@pytest.mark.parametrize("prompt", [32, 37])
@pytest.mark.parametrize("cached", [False, True])
def test_v2_tie_schedule_is_the_reference_loops(prompt, cached):
  """The Fast-dLLM v2 bench rows' floor counts (v2_schedule.forward_kinds:
  tied confidences, one mask a step) are the forwards the reference's
  loop runs, whole-block and sub-block, at a prompt ending on a block
  boundary and mid-block."""
  from flash_dllm_bench import v2_schedule
  f = v2_schedule.forward_kinds(prompt, 48, 16, 4, cached)
  assert (f.whole, f.sub) == _reference_forward_kinds(prompt, 48, 16, 4,
                                                      cached)
  assert f.sub > 0 if cached else f.sub == 0


def test_bench_strategies_v2_subblock_row_runs_sub_block_forwards(tmp_path):
  """The sub-block cache row of --model fast-dllm-v2-7b decodes the tie
  schedule (the bench checks its steps) and its floor counts the
  schedule's whole-block and sub-block forwards."""
  from flash_dllm_bench import v2_schedule
  out = tmp_path / "v2.json"
  bench_strategies().main(["--smoke", "--model", "fast-dllm-v2-7b", "--only",
                           "fast-dllm-v2-subblock", "--json", str(out)])
  data = json.loads(out.read_text())
  (row,) = data["rows"]
  f = v2_schedule.forward_kinds(16, 32, 16, 4, True)
  assert row["steps"] == row["forwards"] == f.steps
  assert row["passes"] == [[16, f.whole], [4, f.sub]] and f.sub > f.whole
  read = data["weight_bytes"] / data["copy_Bps"] * 1e3
  assert row["floor_ms"] >= read and row["read_floor_ms"] == read


def test_bench_moe_smoke_steady_step(tmp_path, capsys):
  """--steady: llada2's step without the prefill, from a second schedule
  of twice the tokens a step (half the steps), and the prefill's share of
  the decode."""
  out = tmp_path / "moe_steady.json"
  # the smoke's tiling: its llada2 step program serves the first schedule
  script("bench_moe").main(["--smoke", "--layer-paths", "--steady",
                            "--tilings", "16,16,16", "--json", str(out)])
  (row,) = json.loads(out.read_text())["rows"]
  # a difference of two timings: its sign is noise on a shared CPU
  assert row["kind"] == "llada2 step" and math.isfinite(row["steady_ms"])
  assert math.isclose(row["prefill_ms"] + row["steady_ms"] * row["steps"],
                      row["ms"] * row["steps"])
  assert "llada2 step, batch 2, prompt 8: steady " in capsys.readouterr().out


def test_decode_buffers_smoke(tmp_path):
  """decode_buffers --smoke: the compiled llada2 decode's memory analysis
  and its largest arrays, largest first, each with its op."""
  out = tmp_path / "buffers.json"
  got = script("decode_buffers").main(["--smoke", "--json", str(out)])
  assert json.loads(out.read_text()) == got
  sizes = [a["bytes"] for a in got["arrays"]]
  assert got["temp_bytes"] > 0 and sizes == sorted(sizes, reverse=True)
  assert any("Transformer" in a["op"] for a in got["arrays"])
