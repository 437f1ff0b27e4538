"""scripts/eval_quality.py: the quality table over strategies x lengths."""

import importlib.util
import json
import re

import pytest

from tests.paths import ROOT, TINY_CHECKPOINT

SCRIPT = ROOT / "scripts" / "eval_quality.py"


def _module():
  spec = importlib.util.spec_from_file_location("eval_quality", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _summary(score, tps, n=10):
  return {"problems": n, "score": score, "tokens_per_step": tps,
          "tokens_per_s": 100.0}


def test_targets_are_computed_from_the_summaries():
  q = _module()
  summaries = {("llada", 128): _summary(0.92, 1.0),
               ("threshold", 128): _summary(0.91, 2.0),
               ("flash-dllm", 128): _summary(0.90, 3.2),
               ("llada", 256): _summary(0.80, 1.0),
               ("flash-dllm", 256): _summary(0.81, 2.0)}
  table = q.quality_table(summaries, [128, 256],
                          ["llada", "threshold", "flash-dllm"])
  assert "| threshold | 128 | 10 | 91.0% | -1.0 | 2.00 | 1.00x | 100.0 |" \
      in table
  assert "| flash-dllm | 128 | 10 | 90.0% | -2.0 | 3.20 | 1.60x | 100.0 |" \
      in table
  assert "| LLaDA sampler >= 90% at gen 128 | 92.0% | PASS |" in table
  assert "| threshold within 1 point of LLaDA at gen 128 | -1.0 pts | PASS |" \
      in table
  assert "| flash-dllm within 1 point of LLaDA at gen 128 | -2.0 pts | FAIL |" \
      in table
  assert "| flash-dllm tok/step >= 1.5x threshold at gen 128 | 1.60x | PASS |" \
      in table
  assert "| LLaDA sampler >= 90% at gen 256 | 80.0% | FAIL |" in table
  assert "| flash-dllm within 1 point of LLaDA at gen 256 | +1.0 pts | PASS |" \
      in table
  # No threshold run at 256: the ratio target is not run, not failed.
  assert ("| flash-dllm tok/step >= 1.5x threshold at gen 256 | - | "
          "n/a (not run) |") in table
  assert ("| flash-dllm tok/step >= 1.5x flash-cache (same window, no "
          "verify) at gen 128 | - | n/a (not run) |") in table
  assert "targets passed: 4/9" in table
  assert q.sampler_options("llada", 256) == {
      "gen_length": 256, "steps": 256, "block_length": 32}
  assert q.sampler_options("fast-dllm-dual", 16) == {
      "gen_length": 16, "block_length": 16}
  assert q.sampler_options("flash-dllm", 128) == {"gen_length": 128}


def test_strategy_variants_carry_options_and_find_their_twin():
  q = _module()
  assert q.parse_strategy("flash-dllm:kv_cache_dtype=float8_e4m3fn") == (
      "flash-dllm", {"kv_cache_dtype": "float8_e4m3fn"})
  assert q.parse_strategy("flash-dllm") == ("flash-dllm", {})
  assert q.parse_strategy("flash-dllm:block_m=64,gamma=0.7,verify=false") == (
      "flash-dllm", {"block_m": 64, "gamma": 0.7, "verify": False})
  with pytest.raises(ValueError, match="key=value"):
    q.parse_strategy("flash-dllm:block_m")
  summaries = {("llada", 128): _summary(0.80, 1.0),
               ("threshold", 128): _summary(0.79, 20.0),
               ("flash-cache:block_m=64", 128): _summary(0.80, 32.0),
               ("flash-dllm:block_m=64", 128): _summary(0.80, 40.0)}
  table = q.quality_table(summaries, [128], [name for name, _ in summaries])
  assert ("| flash-dllm:block_m=64 | 128 | 10 | 80.0% | +0.0 | 40.00 | 2.00x "
          "| 100.0 |") in table
  assert ("| flash-dllm:block_m=64 tok/step >= 1.5x threshold at gen 128 | "
          "2.00x | PASS |") in table
  assert ("| flash-dllm:block_m=64 tok/step >= 1.5x flash-cache:block_m=64 "
          "(same window, no verify) at gen 128 | 1.25x | FAIL |") in table


# What the targets compare (the table's logic is the same for any strategy).
STRATEGIES = ("llada", "threshold", "flash-cache", "flash-dllm")


def test_script_end_to_end_on_the_tiny_checkpoint(tmp_path, capsys):
  """The script's main in this process (its eval runs' programs go to and
  come from the run's persistent compilation cache)."""
  data = tmp_path / "data"
  data.mkdir()
  rows = [{"question": "Tom has 3 apples and buys 4 more. How many now?",
           "answer": "3+4 = <<3+4=7>>7\n#### 7"},
          {"question": "A box holds 6 pens. How many pens are in 2 boxes?",
           "answer": "6*2 = <<6*2=12>>12\n#### 12"}]
  (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = tmp_path / "out"
  assert _module().main([
      "--checkpoint", str(TINY_CHECKPOINT), "--data", str(data),
      "--gen-lengths", "16", "32", "--batch-size", "2", "--strategies",
      *STRATEGIES, "--out-dir", str(out), "--no-progress"]) == 0
  table = (out / "quality.md").read_text()
  assert table in capsys.readouterr().out
  strategies = STRATEGIES
  for length in (16, 32):
    for name in strategies:
      row = re.search(rf"^\| {re.escape(name)} \| {length} \| (\d+) \| "
                      r"([0-9.]+)% \|", table, re.M)
      assert row, (name, length)
      assert row.group(1) == "2" and 0 <= float(row.group(2)) <= 100
  assert "## Targets" in table
  verdicts = re.findall(r"\| (PASS|FAIL|n/a \(not run\)) \|$", table, re.M)
  # Per length: LLaDA >= 90%, 3 accelerated within 1 point, flash-dllm's
  # tokens-per-step ratios over threshold and over flash-cache.
  assert len(verdicts) == 2 * (1 + 3 + 2) and "n/a (not run)" not in verdicts
  # Every (strategy, length) is an ordinary eval run with a summary.
  assert len(list(out.glob("*/summary.json"))) == 2 * len(strategies)
  assert (out / "results.md").exists()


def test_reference_and_baseline_are_chosen():
  q = _module()
  ref, thr = "llada2:threshold=none,block_cache=false", "llada2:block_cache=false"
  assert q.parse_strategy(ref) == ("llada2", {"threshold": None,
                                              "block_cache": False})
  summaries = {(ref, 192): _summary(0.90, 1.0), (thr, 192): _summary(0.90, 2.0),
               ("llada2-flash", 192): _summary(0.88, 5.0)}
  table = q.quality_table(summaries, [192], [ref, thr, "llada2-flash"],
                          reference=ref, baseline=thr)
  assert (f"| llada2-flash | 192 | 10 | 88.0% | -2.0 | 5.00 | 2.50x | 100.0 |"
          in table)
  assert (f"| llada2-flash within 1 point of {ref} at gen 192 | -2.0 pts | "
          "FAIL |") in table
  assert f"| {ref} >= 90% at gen 192 | 90.0% | PASS |" in table


def test_a_canvas_variant_is_compared_to_its_base_on_speed():
  """diffusion-gemma and diffusion-gemma-flash: the generation length is
  their max_out_length; with neither llada nor threshold listed both
  comparisons go to the first strategy; the flash variant's target is
  more tokens per second than its base at equal quality."""
  q = _module()
  assert q.sampler_options("diffusion-gemma-flash", 256) == {
      "max_out_length": 256}
  names = ["diffusion-gemma:canvas_length=64",
           "diffusion-gemma-flash:canvas_length=64"]
  assert q.compared_to(names) == (names[0], names[0])
  assert q.compared_to(["llada", "threshold", "x"]) == ("llada", "threshold")
  summaries = {(names[0], 256): _summary(0.50, 2.0),
               (names[1], 256): {**_summary(0.495, 3.0),
                                 "tokens_per_s": 150.0}}
  table = q.quality_table(summaries, [256], names, *q.compared_to(names))
  assert (f"| {names[1]} | 256 | 10 | 49.5% | -0.5 | 3.00 | 1.50x | "
          "150.0 |") in table
  assert (f"| {names[1]} within 1 point of {names[0]} at gen 256 | "
          "-0.5 pts | PASS |") in table
  assert (f"| {names[1]} tok/s > {names[0]}'s at gen 256 | 1.50x | PASS |"
          in table)
  # A variant's own options (gamma) compare to the base as listed plainly.
  table = q.quality_table({("diffusion-gemma", 256): _summary(0.5, 2.0),
                           ("diffusion-gemma-flash:gamma=0.8", 256):
                           {**_summary(0.4, 3.0), "tokens_per_s": 90.0}},
                          [256], ["diffusion-gemma",
                                  "diffusion-gemma-flash:gamma=0.8"],
                          *q.compared_to(["diffusion-gemma"]))
  assert ("| diffusion-gemma-flash:gamma=0.8 tok/s > diffusion-gemma's at "
          "gen 256 | 0.90x | FAIL |") in table
