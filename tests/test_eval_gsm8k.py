"""GSM8K: answer extraction on the real answers, prompts, data errors, and
scripts/eval_gsm8k.py end to end on the tiny checkpoint."""

import json
from pathlib import Path

import pytest

from tests import eval_case
from tests.paths import TINY_CHECKPOINT
from flash_dllm_jax.eval.tasks import make_render
from flash_dllm_jax.eval.tasks.gsm8k import (DEFAULT_DATA, GSM8K,
                                             extract_answer, normalize_number,
                                             target_of)
from flash_dllm_jax.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _rows(split):
  return [json.loads(l) for l in (DEFAULT_DATA / f"{split}.jsonl").open()]


def test_shipped_data_is_complete():
  assert len(_rows("test")) == 1319 and len(_rows("train")) == 7473
  assert "MIT License" in (DEFAULT_DATA / "LICENSE").read_text()


@pytest.mark.parametrize("split", ["train", "test"])
def test_extraction_recovers_every_real_answer(split):
  rows = _rows(split)
  for row in rows:
    target = target_of(row["answer"])
    float(target)  # every target is a plain number after normalizing
    assert extract_answer(row["answer"]) == target, row["answer"]
  # Without the '####' line, the last number of the real reasoning is the
  # answer for almost every problem (the fallback path on real text).
  hits = sum(extract_answer(r["answer"].split("####")[0]) == target_of(
      r["answer"]) for r in rows)
  assert hits / len(rows) > 0.95


def test_extraction_and_normalization_cases():
  assert target_of("so 2,125 in all.\n#### 2,125") == "2125"
  assert extract_answer("She makes 9 * 2 = $18 every day.") == "18"
  assert extract_answer("#### 5\nthen 7") == "5"  # '####' wins
  assert extract_answer("It costs $1,080.00.") == "1080"
  assert extract_answer("The change is -3.50 dollars") == "-3.5"
  assert extract_answer("no digits here") is None
  assert normalize_number("5.") == "5" and normalize_number("-0") == "0"
  task = GSM8K(num_fewshot=0)
  problem = task.problems(lambda u, p="": u + p)[0]
  assert problem.reference["target"] == "18"
  # Cut at lm-eval's stop sequences before extracting: the next question's
  # numbers must not count.
  scored = task.score([problem], [" 16 - 3 - 4 = 9, 9 * 2 = 18.\n\n"
                                  "Question: what is 5 + 99?"])[0]
  assert scored["output"] == " 16 - 3 - 4 = 9, 9 * 2 = 18.\n\n"
  assert scored["answer"] == "18" and scored["correct"]


def _shots(prompt):
  return prompt.split("Question: ")[1:-1]


def test_five_shot_prompts_in_lm_eval_format():
  task = GSM8K(num_fewshot=5)
  problems = task.problems(lambda u, p="": u + p)
  assert len(problems) == 1319 and problems[7].id == "gsm8k/7"
  train_questions = {r["question"] for r in _rows("train")}
  test_rows = _rows("test")
  for problem, row in zip(problems[:20], test_rows):
    blocks = problem.prompt.split("\n\n")
    assert problem.prompt.endswith(f"Question: {row['question']}\nAnswer:")
    shots = _shots(problem.prompt)
    assert len(shots) == 5 and blocks[0].startswith("Question: ")
    for shot in shots:
      question, answer = shot.split("\nAnswer: ", 1)
      assert question in train_questions and "#### " in answer
  # Exemplars are a fixed function of the problem: rebuilding gives the same.
  assert [p.prompt for p in GSM8K(num_fewshot=5).problems(
      lambda u, p="": u + p)[:20]] == [p.prompt for p in problems[:20]]
  assert _shots(problems[0].prompt) != _shots(problems[1].prompt)


def test_chat_prompt_is_the_user_turn():
  tok = Tokenizer.from_dir(TINY_CHECKPOINT)
  task = GSM8K(num_fewshot=0, chat=True)
  prompt = task.problems(make_render(tok, True))[0].prompt
  question = _rows("test")[0]["question"]
  assert prompt == tok.apply_chat_template(
      [{"role": "user", "content": f"Question: {question}\nAnswer:"}],
      add_generation_prompt=True)


def test_bad_data_is_reported(tmp_path):
  with pytest.raises(FileNotFoundError, match="GSM8K data directory"):
    GSM8K(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="test.jsonl not found"):
    GSM8K(tmp_path)
  good = json.dumps({"question": "q", "answer": "a\n#### 1"})
  cases = {"{not json": r"test.jsonl:2: malformed GSM8K test data, not valid",
           '{"question": "q"}': r"test.jsonl:2: .*missing.*answer",
           '["q", "a"]': r"test.jsonl:2: .*expected a JSON object",
           json.dumps({"question": "q", "answer": "7"}): "no '#### <number>'"}
  for line, message in cases.items():
    (tmp_path / "test.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
      GSM8K(tmp_path, num_fewshot=0)
  (tmp_path / "test.jsonl").write_text("\n")
  with pytest.raises(ValueError, match="no problems"):
    GSM8K(tmp_path, num_fewshot=0)
  (tmp_path / "test.jsonl").write_text(good + "\n")
  with pytest.raises(FileNotFoundError, match="train.jsonl not found"):
    GSM8K(tmp_path, num_fewshot=1)


def test_script_end_to_end(tmp_path):
  out = tmp_path / "out"
  run = eval_case.run_script("gsm8k", out, "--num-fewshot", "0")
  assert "| gsm8k | tiny | llada | 3 |" in run.result.stdout
  assert sorted(r["id"] for r in run.records) == [f"gsm8k/{i}" for i in range(3)]
  for r in run.records:
    assert len(r["prompt_sha256"]) == 64 and isinstance(r["output"], str)
    assert r["tokens"] <= 16 and len(r["token_ids"]) == r["tokens"]
    assert r["target"]
  summary, settings = run.summary, run.settings
  assert summary["problems"] == 3 and summary["metric"] == "accuracy"
  assert summary["tokens_per_s"] > 0 and summary["forwards_per_token"] > 0
  assert summary["peak_device_bytes"] is None  # CPU: no memory stats
  assert settings["sampler"] == {
      "gen_length": 16, "steps": 8, "block_length": 8, "temperature": 0.0,
      "cfg_scale": 0.0, "remasking": "low_confidence",
      "logits_eos_inf": False, "confidence_eos_eot_inf": False}
  assert settings["num_fewshot"] == 0 and settings["chat"] is False
  assert settings["batch_size"] == 2 and settings["strategy"] == "llada"
  assert "n/a*" in (out / "results.md").read_text()
  # The same command again resumes: nothing left to do, same records.
  again = eval_case.run_script("gsm8k", out, "--num-fewshot", "0")
  assert again.records == run.records
