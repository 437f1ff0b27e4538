"""The evaluation command line: one clear error per bad input, the strategy
registry (a new strategy is one entry, its options become flags), and the
report over several runs."""

import json
import runpy
import sys
from pathlib import Path

import pytest

from flash_dllm_jax import strategies
from flash_dllm_jax.eval import cli, report
from flash_dllm_jax.strategies import Strategy, build_sampler
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from tests.paths import TINY_CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--checkpoint", str(TINY_CHECKPOINT), "--gen-length", "16", "--steps",
        "8", "--block-length", "8", "--no-progress"]
SHORT = ["--data", str(ROOT / "data" / "synthetic_gsm")]  # short questions


def _error(capsys, argv) -> str:
  assert cli.main(argv) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: ") and len(err) <= 2, err
  return err[-1]


@pytest.mark.parametrize("argv, message", [
    (["gsm8k", "--checkpoint", "/nonexistent/ckpt"],
     "checkpoint directory /nonexistent/ckpt does not exist"),
    (["gsm8k", "--data", "/nonexistent/gsm8k"],
     "GSM8K data directory /nonexistent/gsm8k not found"),
    (["humaneval", "--data", "/nonexistent/he.jsonl"],
     "HumanEval data file /nonexistent/he.jsonl not found"),
    (["gsm8k", "--strategy", "magic"],
     "unknown strategy 'magic'; known: " + ", ".join(sorted(strategies.STRATEGIES))),
    (["gsm8k", "--strategy", "dream"],
     "strategy 'dream' decodes dream checkpoints, not 'llada'"),
    (["gsm8k", "--alg", "entropy"],
     "option(s) --alg do not apply to strategy 'llada'"),
    (["gsm8k", "--gen-length", "10", "--block-length", "4"],
     "gen_length (10) must be a multiple of block_length (4)"),
    (["gsm8k", "--steps", "0"], "steps must be a positive int, got 0"),
    (["gsm8k", "--temperature", "-1"],
     "temperature must be in [0, 2], got -1.0"),
    (["gsm8k", "--remasking", "sometimes"], "remasking must be one of"),
    (["gsm8k", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["gsm8k", "--limit", "-2"], "--limit must be >= 1, got -2"),
    (["gsm8k", "--num-fewshot", "-1"], "num_fewshot must be an int >= 0"),
    (["gsm8k", "--num-fewshot", "9000"], "num_fewshot 9000 exceeds"),
    (["gsm8k", "--run-name", "a/b"], "--run-name must be a plain name"),
    (["humaneval", "--timeout", "0"], "timeout must be > 0 seconds"),
    (["humaneval", "--memory-mb", "10"], "memory limit must be an int >= 64"),
    (["humaneval", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["report", "/nonexistent/out"], "no run summaries"),
])
def test_bad_input_gets_one_clear_error(capsys, argv, message):
  assert message in _error(capsys, argv)


def test_humaneval_without_bubblewrap_refuses_before_loading(
    monkeypatch, capsys, tmp_path):
  from flash_dllm_jax.eval import sandbox
  monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
  monkeypatch.setattr(cli, "start_compile_cache", None)  # never reached
  sandbox.bwrap_problem.cache_clear()
  try:
    err = _error(capsys, ["humaneval", "--out-dir", str(tmp_path / "o"),
                          *TINY])
  finally:
    sandbox.bwrap_problem.cache_clear()
  assert "Debian package bubblewrap" in err and "--sandbox rlimit" in err
  assert not (tmp_path / "o").exists()


def test_malformed_data_and_too_long_prompts(capsys, tmp_path):
  (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": 3}\n')
  err = _error(capsys, ["gsm8k", "--data", str(tmp_path), "--num-fewshot",
                        "0"])
  assert "test.jsonl:1: malformed GSM8K test data" in err
  # 5-shot prompts are longer than the tiny model's 512-token context.
  err = _error(capsys, ["gsm8k", "--limit", "2", "--out-dir",
                        str(tmp_path / "o"), *TINY])
  assert "do not fit the model's context" in err
  assert not (tmp_path / "o").exists()  # nothing written for a failed check


def test_a_new_strategy_is_one_registry_entry(monkeypatch, capsys, tmp_path):
  entry = Strategy("llada-random", LLaDASampler,
                   fixed={"remasking": "random"})
  monkeypatch.setitem(strategies.STRATEGIES, entry.name, entry)
  sampler = build_sampler("llada-random", "llada", {"gen_length": 16,
                                                    "steps": 8})
  assert sampler == LLaDASampler(gen_length=16, steps=8, remasking="random")
  with pytest.raises(ValueError, match="--remasking do not apply"):
    build_sampler("llada-random", "llada", {"remasking": "low_confidence"})
  assert "llada-random" in strategies.strategies_taking("cfg_scale")
  out = tmp_path / "o"
  assert cli.main(["gsm8k", "--strategy", "llada-random", "--limit", "2",
                   "--batch-size", "2", "--num-fewshot", "0", "--out-dir",
                   str(out), *SHORT, *TINY]) == 0
  (run,) = [p for p in out.iterdir() if p.is_dir()]
  assert run.name.startswith("llada-random-")
  settings = json.loads((run / "run.json").read_text())
  assert settings["sampler"]["remasking"] == "random"


def test_interrupted_command_resumes(monkeypatch, capsys, tmp_path):
  from flash_dllm_jax.eval import runner
  real, calls = runner.generate, []

  def generate(*args, **kw):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real(*args, **kw)

  monkeypatch.setattr(runner, "generate", generate)
  argv = ["gsm8k", "--limit", "4", "--batch-size", "2", "--num-fewshot", "0",
          "--out-dir", str(tmp_path), "--run-name", "r", *SHORT, *TINY[:-1]]
  assert cli.main(argv) == 130
  err = capsys.readouterr().err
  assert "rerun the same command to resume" in err
  assert "tok_s=" in err  # the progress bar's live throughput
  jsonl = tmp_path / "r/records.jsonl"
  assert len(jsonl.read_text().splitlines()) == 2
  assert cli.main(argv) == 0 and len(calls) == 3
  assert len(jsonl.read_text().splitlines()) == 4


def test_flags_come_from_the_sampler_fields():
  options = strategies.all_options()
  assert options["gen_length"] is int and options["top_p"] is float
  assert options["logits_eos_inf"] is bool and options["alg"] is str
  args = cli.parser().parse_args(["gsm8k", "--top-p", "0.9",
                                  "--no-logits-eos-inf"])
  assert args.top_p == 0.9 and args.logits_eos_inf is False
  assert build_sampler("dream", "dream", {"top_p": 0.9}) == DreamSampler(
      top_p=0.9)


def _summary(name, strategy, score, tok_s, metric="accuracy", peak=None):
  return {"task": "gsm8k", "metric": metric, "run_name": name,
          "strategy": strategy, "problems": 10, "score": score,
          "tokens_per_s": tok_s, "forwards_per_token": 1.0,
          "tokens_per_step": 2.0, "peak_device_bytes": peak,
          "settings": {"chat": True, "num_fewshot": 5, "batch_size": 8,
                       "sampler": {"gen_length": 256, "steps": 256}}}


def test_report_over_several_runs(tmp_path, monkeypatch, capsys):
  for s in [_summary("a", "llada", 0.5, 100.0, peak=3 * 2**30),
            _summary("b", "fast", 0.45, 400.0)]:
    (tmp_path / s["run_name"]).mkdir()
    report.write_summary(tmp_path / s["run_name"] / "summary.json", s)
  script = ROOT / "scripts" / "eval_report.py"  # as `python SCRIPT DIR`
  monkeypatch.setattr(sys, "argv", [str(script), str(tmp_path)])
  with pytest.raises(SystemExit) as done:
    runpy.run_path(str(script), run_name="__main__")
  assert done.value.code == 0
  table = (tmp_path / report.TABLE).read_text()
  assert capsys.readouterr().out.strip() == table.strip()
  assert "| gsm8k | a | llada | 10 | 50.0% | 100.0 | 1.000 | 2.00 | 3.00 GiB" \
      in table
  assert "| gsm8k | b | fast | 10 | 45.0% | 400.0 |" in table
  assert "n/a*" in table and "no device memory statistics" in table
  assert (tmp_path / report.PLOT).read_bytes()[:4] == b"\x89PNG"


def test_refillable_strategy_uses_continuous_batching(monkeypatch, tmp_path):
  """flash-cache decodes 5 problems through 2 slots in one generate call;
  the records equal a static batch of all 5 (results never depend on the
  batch), and each counts its own steps (the shipped model's answers end at
  different steps, so slots are refilled at different times)."""
  from flash_dllm_jax.eval import runner
  real, calls = runner.generate, []

  def generate(*args, **kw):
    calls.append(kw.get("batch_size"))
    return real(*args, **kw)

  monkeypatch.setattr(runner, "generate", generate)
  common = ["gsm8k", "--strategy", "flash-cache", "--limit", "5", *SHORT,
            "--num-fewshot", "0", "--out-dir", str(tmp_path), "--gen-length",
            "16", "--block-m", "4", "--track-num", "2", "--mask-num", "2",
            "--no-progress"]
  assert cli.main(common + ["--batch-size", "2", "--run-name", "slots"]) == 0
  assert calls == [2]
  assert cli.main(common + ["--batch-size", "8", "--run-name", "static"]) == 0
  read = lambda name: {r["id"]: r for r in map(json.loads, (
      tmp_path / name / "records.jsonl").read_text().splitlines())}
  slots, static = read("slots"), read("static")
  assert len(slots) == 5 and slots.keys() == static.keys()
  for pid, rec in slots.items():
    assert rec["token_ids"] == static[pid]["token_ids"]
    assert rec["steps"] == static[pid]["steps"] >= 1
  assert len({rec["steps"] for rec in slots.values()}) > 1  # staggered refills
  # --temperature / --top-k sample flash-cache's rows (it has no such
  # fields): the same programs, the same answers through slots or one batch
  sample = ["--temperature", "1.5", "--top-k", "50"]
  assert cli.main(common + sample + ["--batch-size", "2", "--run-name",
                                     "sampled-slots"]) == 0
  assert cli.main(common + sample + ["--batch-size", "8", "--run-name",
                                     "sampled-static"]) == 0
  a, b = read("sampled-slots"), read("sampled-static")
  assert all(a[k]["token_ids"] == b[k]["token_ids"] for k in a)
  assert any(a[k]["token_ids"] != slots[k]["token_ids"] for k in a)
  run = json.loads((tmp_path / "sampled-slots" / "run.json").read_text())
  assert run["sampling"]["temperature"] == 1.5
