"""The resumable runner: JSONL durability, resume after an interruption,
settings/prompt checks, and the metrics it reports."""

import json
import re

import numpy as np
import pytest

import flash_dllm_jax
from tests.paths import TINY_CHECKPOINT
from flash_dllm_jax.eval import report, runner
from flash_dllm_jax.eval.records import RecordStore, open_run
from flash_dllm_jax.eval.tasks.gsm8k import GSM8K
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler

SAMPLER = LLaDASampler(gen_length=16, steps=8, block_length=8)
SETTINGS = {"task": "gsm8k", "strategy": "llada", "batch_size": 2}


@pytest.fixture(scope="module")
def model():
  return flash_dllm_jax.load(TINY_CHECKPOINT)


def _run(model, run_dir, **kw):
  return runner.run_eval(GSM8K(num_fewshot=0), model, SAMPLER, run_dir,
                         SETTINGS, batch_size=2, limit=4, progress=False, **kw)


def _lines(path):
  return [json.loads(l) for l in path.read_text().splitlines()]


def test_resume_after_interruption_loses_and_repeats_nothing(
    model, tmp_path, monkeypatch):
  reference = _run(model, tmp_path / "full")
  ref_records = {r["id"]: r for r in _lines(tmp_path / "full/records.jsonl")}

  def interrupt(batch):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    _run(model, tmp_path / "run", on_batch=interrupt)
  jsonl = tmp_path / "run/records.jsonl"
  saved = _lines(jsonl)
  assert len(saved) == 2 and not (tmp_path / "run/summary.json").exists()
  # A kill in the middle of the next write leaves half a line behind.
  with open(jsonl, "a") as f:
    f.write(json.dumps(ref_records["gsm8k/3"])[:40])

  calls = []
  real_generate = runner.generate
  monkeypatch.setattr(runner, "generate", lambda m, prompts, **kw: (
      calls.append(len(prompts)), real_generate(m, prompts, **kw))[1])
  summary = _run(model, tmp_path / "run")
  assert calls == [2]  # only the unfinished batch is generated again
  records = _lines(jsonl)
  assert sorted(r["id"] for r in records) == sorted(ref_records)
  assert records[:2] == saved  # finished problems kept as they were
  for r in records:  # and every answer equals the uninterrupted run's
    assert r["token_ids"] == ref_records[r["id"]]["token_ids"]
    assert r["prompt_sha256"] == ref_records[r["id"]]["prompt_sha256"]
  assert summary["problems"] == reference["problems"] == 4
  assert summary["generated_tokens"] == reference["generated_tokens"]
  # Rerunning a finished run generates nothing.
  calls.clear()
  _run(model, tmp_path / "run")
  assert calls == []


def test_resume_refuses_other_settings_or_prompts(model, tmp_path):
  _run(model, tmp_path / "run")
  with pytest.raises(ValueError, match="other settings.*batch_size"):
    runner.run_eval(GSM8K(num_fewshot=0), model, SAMPLER, tmp_path / "run",
                    {**SETTINGS, "batch_size": 4}, batch_size=4, limit=4,
                    progress=False)
  jsonl = tmp_path / "run/records.jsonl"
  records = _lines(jsonl)
  records[0]["prompt_sha256"] = "0" * 64
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
  with pytest.raises(ValueError, match="different prompt"):
    _run(model, tmp_path / "run")


def test_record_store_tolerates_only_a_cut_last_line(tmp_path):
  path = tmp_path / "r.jsonl"
  path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "out')
  store = RecordStore(path)
  assert list(store.records) == ["a", "b"]
  assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'
  store.append([{"id": "c"}])
  assert [r["id"] for r in _lines(path)] == ["a", "b", "c"]
  # A complete last record lacking its newline is kept, the newline added.
  path.write_text('{"id": "a"}\n{"id": "b"}')
  assert list(RecordStore(path).records) == ["a", "b"]
  assert path.read_text().endswith("}\n")
  path.write_text('{"id": "a"}\nnot json\n{"id": "c"}\n')
  with pytest.raises(ValueError, match=r"r.jsonl:2: corrupt record"):
    RecordStore(path)


def test_open_run_records_settings(tmp_path):
  open_run(tmp_path / "x", {"a": (1, 2), "b": "c"})
  assert json.loads((tmp_path / "x/run.json").read_text()) == {
      "a": [1, 2], "b": "c"}
  open_run(tmp_path / "x", {"a": (1, 2), "b": "c"})  # same settings: fine


def test_too_long_prompts_are_reported_before_decoding(model, tmp_path):
  with pytest.raises(ValueError, match=r"do not fit.*gsm8k/0.*max_seq_len"):
    runner.run_eval(GSM8K(num_fewshot=5), model, SAMPLER, tmp_path / "r",
                    SETTINGS, batch_size=2, limit=2, progress=False)


def test_answer_length_counts_through_eos():
  assert runner.answer_length(np.array([5, 6, 9, 9, 9]), (9,)) == 3
  assert runner.answer_length(np.array([9, 1]), (7, 9)) == 1
  assert runner.answer_length(np.array([5, 6, 7]), (9,)) == 3


def test_summary_metrics():
  base = {"correct": True, "peak_device_bytes": None}
  records = [  # batch x: 2 rows sharing 3 s (1 s compiling); batch y: 1 row
      {**base, "id": "1", "batch": "x", "wall_s": 3.0, "compile_s": 1.0,
       "tokens": 10, "forwards": 20, "steps": 5},
      {**base, "id": "2", "batch": "x", "wall_s": 3.0, "compile_s": 1.0,
       "tokens": 6, "forwards": 20, "steps": 5, "correct": False},
      {**base, "id": "3", "batch": "y", "wall_s": 2.0, "compile_s": 0.0,
       "tokens": 4, "forwards": 10, "steps": 10, "peak_device_bytes": 7}]
  s = report.summarize(records, task="t", metric="accuracy",
                       settings={"strategy": "llada"}, limit=None, run_name="r")
  assert s["score"] == pytest.approx(2 / 3)
  assert s["wall_s"] == 5.0 and s["compile_s"] == 1.0
  assert s["tokens_per_s"] == pytest.approx(20 / 4.0)
  assert s["forwards_per_token"] == pytest.approx(50 / 20)
  assert s["tokens_per_step"] == pytest.approx(20 / 20)
  assert s["peak_device_bytes"] == 7


def _gsm8k_dir(tmp_path, questions):
  tmp_path.mkdir(parents=True, exist_ok=True)
  rows = [json.dumps({"question": q, "answer": f"so\n#### {i}"})
          for i, q in enumerate(questions)]
  (tmp_path / "test.jsonl").write_text("\n".join(rows) + "\n")
  return tmp_path


def test_an_undecodable_problem_is_recorded_and_the_run_goes_on(
    model, tmp_path, capsys):
  """A question holding the mask token fails its own problem, with its id
  and the error; the others decode, the summary counts it, and a resumed
  run (or the command line) keeps it as it is."""
  data = _gsm8k_dir(tmp_path / "data", [
      "What is 2 + 3?", "Fill in: <|mdm_mask|> + 1 = 2", "What is 7 - 4?"])
  task = GSM8K(data, num_fewshot=0)
  summary = runner.run_eval(task, model, SAMPLER, tmp_path / "r", SETTINGS,
                            batch_size=2, progress=False)
  assert "warning: gsm8k/1 cannot be decoded" in capsys.readouterr().err
  records = {r["id"]: r for r in _lines(tmp_path / "r/records.jsonl")}
  assert sorted(records) == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
  bad = records["gsm8k/1"]
  assert bad["error"] == "its prompt contains the mask token id 383"
  assert bad["correct"] is False and bad["tokens"] == 0
  for good in ("gsm8k/0", "gsm8k/2"):
    assert "error" not in records[good] and records[good]["tokens"] >= 1
  assert summary["problems"] == 3 and summary["undecodable"] == 1
  assert summary["batches"] == 1  # the error is in no batch
  assert summary["correct"] == sum(r["correct"] for r in records.values())
  again = runner.run_eval(task, model, SAMPLER, tmp_path / "r", SETTINGS,
                          batch_size=2, progress=False)
  assert len(_lines(tmp_path / "r/records.jsonl")) == 3
  assert again["undecodable"] == 1 and again["problems"] == 3


def test_the_command_line_reports_undecodable_problems(tmp_path, capsys):
  from flash_dllm_jax.eval import cli
  data = _gsm8k_dir(tmp_path / "data", ["Fill in: <|mdm_mask|>", "1 + 1?"])
  argv = ["gsm8k", "--data", str(data), "--num-fewshot", "0", "--checkpoint",
          str(TINY_CHECKPOINT), "--gen-length", "16", "--steps", "8",
          "--block-length", "8", "--batch-size", "2", "--no-progress",
          "--out-dir", str(tmp_path / "out"), "--run-name", "r"]
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "warning: gsm8k/0 cannot be decoded (its prompt contains the mask " \
         "token id 383); recorded as an error" in err
  assert re.search(r"accuracy [01]/2 \(1 undecodable, see their records' "
                   r"error\)", err), err


def test_a_too_long_problem_is_recorded_and_the_run_goes_on(model, tmp_path,
                                                            capsys):
  """One question too long for the tiny model's 512-token context among
  short ones: its problem is recorded as not decodable, the others decode;
  when no prompt fits, the run is refused before anything is written."""
  data = _gsm8k_dir(tmp_path / "data", [
      "What is 2 + 3?", "Count: " + "one two three " * 200, "What is 7 - 4?"])
  summary = runner.run_eval(GSM8K(data, num_fewshot=0), model, SAMPLER,
                            tmp_path / "r", SETTINGS, batch_size=2,
                            progress=False)
  err = capsys.readouterr().err
  assert re.search(r"warning: gsm8k/1 cannot be decoded \(its prompt \(\d+ "
                   r"tokens\) does not fit the model's context: .*max_seq_len"
                   r" 512.*\); recorded as an error", err), err
  records = {r["id"]: r for r in _lines(tmp_path / "r/records.jsonl")}
  assert sorted(records) == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
  assert records["gsm8k/1"]["correct"] is False
  assert records["gsm8k/1"]["tokens"] == 0
  assert all("error" not in records[i] and records[i]["tokens"] >= 1
             for i in ("gsm8k/0", "gsm8k/2"))
  assert summary["problems"] == 3 and summary["undecodable"] == 1
  long_only = _gsm8k_dir(tmp_path / "long", ["Count: " + "one " * 600])
  with pytest.raises(ValueError, match=r"1 prompt\(s\) do not fit the "
                     r"model's context: gsm8k/0"):
    runner.run_eval(GSM8K(long_only, num_fewshot=0), model, SAMPLER,
                    tmp_path / "r2", SETTINGS, batch_size=2, progress=False)
  assert not (tmp_path / "r2").exists()


@pytest.mark.parametrize("seed, limit, message", [
    (-1, 2, r"seed must be an int in \[0, 2\*\*32\), got -1"),
    (2 ** 32 - 2, 4, r"seed 4294967294 is too large: problem i uses seed \+ "
                     r"i, .*up to 4294967297"),
])
def test_seeds_outside_uint32_are_refused_before_the_run(model, tmp_path,
                                                         seed, limit, message):
  with pytest.raises(ValueError, match=message):
    runner.run_eval(GSM8K(num_fewshot=0), model, SAMPLER, tmp_path / "r",
                    SETTINGS, batch_size=2, limit=limit, seed=seed,
                    progress=False)
  assert not (tmp_path / "r").exists()
