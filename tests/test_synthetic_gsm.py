"""The synthetic GSM corpus and the project tokenizer built from it.

Oracles: `check_solution` re-evaluates every calculator annotation (and is
itself checked on hand-made good and broken solutions and a real GSM8K row);
GSM8K's answer extraction from the eval task; the tokenizer's save/load.
"""

import collections
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.gsm_format import (Solution, annotations,
                                            check_solution, evaluate)
from flash_dllm_data.problem_kit import TEST_NAMES, TRAIN_NAMES
from flash_dllm_data.tokenizer_builder import (SPECIAL_TOKENS,
                                                   build_tokenizer,
                                                   corpus_texts)
from flash_dllm_jax.eval.tasks.gsm8k import extract_answer, target_of
from flash_dllm_jax.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "make_synthetic_gsm", ROOT / "scripts" / "make_synthetic_gsm.py")
make_synthetic_gsm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_synthetic_gsm)

GOOD = ("Tom buys 3*12 = $<<3*12=36>>36 of pens.\n"
        "He has 50-36 = <<50-36=14>>14 left.\n#### 14")


@pytest.fixture(scope="module")
def train_problems():
  return sg.generate(2000, seed=0)


@pytest.fixture(scope="module")
def test_problems():
  return sg.generate(600, seed=1, split="test")


def test_deterministic_per_seed_and_prefix_stable():
  a = sg.generate(40, seed=7)
  assert a == sg.generate(40, seed=7)
  assert sg.generate(15, seed=7) == a[:15]  # problem i ignores n
  b = sg.generate(40, seed=8)
  assert sum(x["question"] != y["question"] for x, y in zip(a, b)) >= 35
  assert sg.generate(20, 7, "test") != sg.generate(20, 7, "train")


def test_every_answer_checks_out(train_problems, test_problems):
  for row in train_problems + test_problems:
    assert check_solution(row["answer"]), row
    values = [evaluate(expr) for expr, _ in annotations(row["answer"])]
    assert all(v.denominator == 1 and v > 0 for v in values), row
    assert row["steps"] == len(values)
    assert row["answer"].splitlines()[-1] == f"#### {values[-1]}"


def test_step_counts_span_two_to_six(train_problems, test_problems):
  for rows in (train_problems, test_problems):
    counts = collections.Counter(r["steps"] for r in rows)
    assert set(counts) <= set(range(2, 7))
  counts = collections.Counter(r["steps"] for r in train_problems)
  assert set(counts) == set(range(2, 7)), counts


def test_template_mix_and_held_out_splits(train_problems, test_problems):
  assert len(sg.ALL_TEMPLATES) >= 12 and len(sg.TRAIN_TEMPLATES) >= 12
  assert not set(sg.TRAIN_TEMPLATES) & set(sg.HELD_OUT_TEMPLATES)
  train_t = collections.Counter(r["template"] for r in train_problems)
  assert set(train_t) == set(sg.TRAIN_TEMPLATES)
  # The test split is another mix of the train templates (TEST_MIX).
  test_t = collections.Counter(r["template"] for r in test_problems)
  assert set(test_t) == set(sg.TRAIN_TEMPLATES)
  weight = dict(zip(sorted(sg.TRAIN_TEMPLATES), sg.TEST_MIX))
  heavy = sum(test_t[t] for t in weight if weight[t] == 3)
  assert abs(heavy / len(test_problems)
             - 3 * sum(w == 3 for w in sg.TEST_MIX) / sum(sg.TEST_MIX)) < 0.07
  # The ood probe: templates and names train never uses.
  ood = sg.generate(60, 1, "ood")
  assert {r["template"] for r in ood} == set(sg.HELD_OUT_TEMPLATES)
  assert not {p.name for p in TRAIN_NAMES} & {p.name for p in TEST_NAMES}
  words = lambda rows: {w for r in rows for w in re.findall(r"[A-Z][a-z]+",
                                                            r["question"])}
  assert words(ood) & {p.name for p in TEST_NAMES}
  assert not words(ood) & {p.name for p in TRAIN_NAMES}
  assert not words(train_problems) & {p.name for p in TEST_NAMES}


def test_held_out_drops_questions_found_in_train():
  train = sg.generate(40, 0, "train")
  # A test stream seeded like train repeats train questions: all replaced.
  drawn = sg.generate(10, 0, "train")
  kept = sg.held_out(drawn, train, 10, 0, "train")
  assert len(kept) == 10
  assert not {p["question"] for p in kept} & {p["question"] for p in train}
  assert kept == sg.generate(50, 0, "train")[40:]  # the stream's next ones


def test_gsm8k_extraction_reads_the_final_answer(train_problems):
  for row in train_problems[:300]:
    final = row["answer"].splitlines()[-1].split()[-1]
    assert extract_answer(row["answer"]) == target_of(row["answer"]) == final
    assert int(final) > 0


def test_check_solution_rejects_broken_solutions():
  assert check_solution(GOOD)
  real = json.loads(open(ROOT / "data/gsm8k/train.jsonl").readline())["answer"]
  assert check_solution(real)  # GSM8K's own format (Natalia, 72)
  broken = [
      GOOD.replace("=36>>", "=37>>"),                   # wrong value
      GOOD.replace(">>36 of", ">>37 of"),               # text disagrees
      GOOD.replace("#### 14", "#### 15"),               # wrong final
      GOOD.replace("\n#### 14", ""),                    # no final line
      GOOD.replace("#### 14", "#### 36"),               # not the last value
      GOOD.replace("3*12=36", "__import__('os')=36"),   # not arithmetic
      "#### 14",                                        # no steps
      GOOD + "\n#### 14",                               # two finals
      "",
  ]
  for text in broken:
    assert not check_solution(text), text
  assert not check_solution(None)


def test_solution_builder_rejects_bad_values():
  s = Solution()
  assert s.step("He has @ left.", "50-36") == 14
  for expr in ("7/2", "3-5", "4-4"):
    with pytest.raises(sg.Reject):
      s.step("x @", expr)
  with pytest.raises(ValueError, match="placeholder|exactly one"):
    s.step("no placeholder", "1+1")
  with pytest.raises(ValueError, match="unknown template"):
    sg.make_problem("nope", random.Random(0))
  with pytest.raises(ValueError, match="split"):
    sg.generate(3, 0, "dev")


def test_cli_writes_reproducible_splits(tmp_path):
  for out in (tmp_path / "a", tmp_path / "b"):
    make_synthetic_gsm.main([str(out), "--train", "50", "--test", "20",
                             "--seed", "3"])
  for name in ("train.jsonl", "test.jsonl", "info.json"):
    assert (tmp_path / "a" / name).read_bytes() == \
        (tmp_path / "b" / name).read_bytes()
  rows = sg.read_jsonl(tmp_path / "a" / "test.jsonl")
  assert len(rows) == 20 and all(check_solution(r["answer"]) for r in rows)
  info = json.loads((tmp_path / "a" / "info.json").read_text())
  assert info["test_seed"] == 4 and info["ood"] == 0
  assert not (tmp_path / "a" / "ood.jsonl").exists()
  make_synthetic_gsm.main([str(tmp_path / "c"), "--train", "50", "--test",
                           "20", "--ood", "5"])
  train = {r["question"] for r in sg.read_jsonl(tmp_path / "c" / "train.jsonl")}
  test = {r["question"] for r in sg.read_jsonl(tmp_path / "c" / "test.jsonl")}
  assert len(test) == 20 and not train & test
  assert len(sg.read_jsonl(tmp_path / "c" / "ood.jsonl")) == 5


def test_tokenizer_round_trip(tmp_path, train_problems, test_problems):
  tok, ids = build_tokenizer(corpus_texts(train_problems), vocab_size=1024)
  assert tok.vocab_size == 1024
  assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(
      range(1024 - len(SPECIAL_TOKENS), 1024))
  config = ModelConfig.tiny("llada", vocab_size=1024, **ids)
  assert config.mask_token_id == tok.token_to_id("<|mdm_mask|>")
  assert config.stop_token_ids == (tok.token_to_id("<|endoftext|>"),
                                   tok.token_to_id("<|eot_id|>"))
  tok.save(tmp_path)
  back = Tokenizer.from_dir(tmp_path)
  turn = [{"role": "user", "content": test_problems[0]["question"]}]
  prompt = tok.apply_chat_template(turn)
  assert prompt.startswith("<|startoftext|><|start_header_id|>user")
  assert back.apply_chat_template(turn) == prompt
  assert back.encode(prompt) == tok.encode(prompt)
  assert (back.bos_id, back.eos_id, back.eot_id, back.mask_id) == (
      ids["bos_token_id"], ids["eos_token_id"], ids["eot_token_id"],
      ids["mask_token_id"])
  for row in test_problems[:50]:  # unseen names still round-trip
    for text in (row["question"], row["answer"]):
      assert back.decode(back.encode(text)) == text
  pieces = [back.backend.id_to_token(i) for i in back.encode("x 12345 y")]
  assert [p for p in pieces if p.isdigit()] == list("12345")
  with pytest.raises(ValueError, match="vocab_size"):
    build_tokenizer(["a b c"], vocab_size=100)


def test_parallel_generation_draws_the_same_problems():
  assert sg.generate(41, 5, "train", workers=2) == sg.generate(41, 5, "train")


def test_fast_integer_path_equals_the_general_evaluator():
  """Flat integer expressions (what templates write) take a fast exact path;
  its values, and its errors, are those of the ast + Fraction path."""
  from fractions import Fraction
  from flash_dllm_data import gsm_format
  rng = random.Random(0)
  for _ in range(3000):
    parts = [str(rng.choice([0, 1, 2, 7, 100, rng.randint(0, 999)]))]
    for _ in range(rng.randint(0, 4)):
      parts += [rng.choice("+-*/"), str(rng.choice([0, 1, 3, 4, 100,
                                                   rng.randint(0, 999)]))]
    expr = "".join(parts)
    assert gsm_format._FLAT_INT_EXPR.fullmatch(expr)
    try:
      want = Fraction(eval(expr.replace("/", "*Fraction(1)/")))
    except ZeroDivisionError:
      with pytest.raises(ValueError, match="division by zero"):
        evaluate(expr)
      continue
    assert evaluate(expr) == want, expr
    fast = gsm_format._exact_int(expr)
    assert fast == want and (type(fast) is int) == (want.denominator == 1)
  for other in ("07+1", "1 + 2", "(1+2)*3", "-4*2", "2.5*2", "1e3"):
    assert gsm_format._exact_int(other) is None  # the general path's cases
  with pytest.raises(ValueError):
    evaluate("07+1")  # as before: Python rejects leading zeros


def test_draw_is_the_stream_and_attempts_are_other_problems():
  assert [sg.draw("train", 3, i) for i in range(5)] == sg.generate(5, 3)
  assert sg.draw("test", 1, 4) == sg.generate(5, 1, "test")[4]
  again = [sg.draw("train", 3, 2, a)["question"] for a in range(1, 6)]
  assert sg.draw("train", 3, 2)["question"] not in again
  assert len(set(again)) == 5
