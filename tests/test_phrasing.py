"""The 'varied' phrasing of the synthetic GSM corpus (data/phrasing.py).

Oracles: the 'fixed' corpus pinned by hash (the corpus the earlier models
were trained on, unchanged by the refactor); the 'fixed' rendering of the
same problem, to which a varied answer must reduce once the variants are
undone; exact evaluation of every step.
"""

import collections
import hashlib
import json
import random

import numpy as np
import pytest

from flash_dllm_data import phrasing
from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.gsm_format import (PLACEHOLDER, Solution,
                                            annotations, check_solution,
                                            evaluate)

# sha256 of generate(300, 0) + generate(100, 1, 'test') + generate(50, 1,
# 'ood') under phrasing 'fixed', computed before phrasing existed.
FIXED_SHA256 = "38d5b7864ad98929d2a9a850df03dd7e42ea552a9122daf8d1077bbcc0f67935"


def _fixed_and_varied(n, seed, split):
  return (sg.generate(n, seed, split, phrasing="fixed"),
          sg.generate(n, seed, split, phrasing="varied"))


def test_fixed_phrasing_is_the_earlier_corpus_exactly():
  rows = (sg.generate(300, 0, phrasing="fixed")
          + sg.generate(100, 1, "test", phrasing="fixed")
          + sg.generate(50, 1, "ood", phrasing="fixed"))
  digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode())
  assert digest.hexdigest() == FIXED_SHA256


def _opener(line: str, fixed_line: str) -> str:
  """The opener the varied `line` added to `fixed_line` ('' if none)."""
  for opener, _ in phrasing.OPENERS[1:]:
    if line.startswith(opener) and not fixed_line.startswith(opener):
      return opener
  return ""


def _undo(line: str, fixed_line: str) -> bool:
  """True iff `line` is `fixed_line` with at most an opener (and the first
  letter lowered) and the terms of its calculation reversed."""
  opener = _opener(line, fixed_line)
  body = line[len(opener):]
  if opener:
    if fixed_line[:1].lower() != body[:1] and fixed_line[:1] != body[:1]:
      return False
    body = fixed_line[:1] + body[1:]
  if body == fixed_line:
    return True
  (expr, value), = annotations(line)
  (fixed_expr, fixed_value), = annotations(fixed_line)
  op = "+" if "+" in fixed_expr else "*"
  return (op.join(reversed(fixed_expr.split(op))) == expr
          and value == fixed_value
          and body.replace(expr, fixed_expr) == fixed_line)


@pytest.mark.parametrize("split,seed", [("train", 0), ("test", 1), ("ood", 1)])
def test_varied_keeps_questions_values_and_meaning(split, seed):
  fixed, varied = _fixed_and_varied(300, seed, split)
  for f, v in zip(fixed, varied):
    assert v["question"] == f["question"] and v["steps"] == f["steps"]
    assert check_solution(v["answer"]), v["answer"]
    assert ([evaluate(e) for e, _ in annotations(v["answer"])]
            == [evaluate(e) for e, _ in annotations(f["answer"])])
    lines, fixed_lines = v["answer"].split("\n"), f["answer"].split("\n")
    assert lines[-1] == fixed_lines[-1]  # '#### N'
    for line, fixed_line in zip(lines[:-1], fixed_lines[:-1]):
      assert _undo(line, fixed_line), (line, fixed_line)


def test_varied_choice_frequencies_are_the_designed_ones():
  fixed, varied = _fixed_and_varied(3000, 0, "train")
  openers = collections.Counter()
  swaps = eligible = 0
  for f, v in zip(fixed, varied):
    for line, fixed_line in zip(v["answer"].split("\n")[:-1],
                                f["answer"].split("\n")[:-1]):
      openers[_opener(line, fixed_line)] += 1
      (expr, _), = annotations(line)
      (fixed_expr, _), = annotations(fixed_line)
      if phrasing._PURE_SUM.fullmatch(fixed_expr) or (
          phrasing._PURE_PRODUCT.fullmatch(fixed_expr)):
        eligible += 1
        swaps += expr != fixed_expr
  total = sum(openers.values())
  assert total > 10000
  # A line that already starts with "Then" keeps its wording when drawn
  # "Then ", so that opener is a little rarer than drawn.
  for opener, want in phrasing.OPENERS:
    assert abs(openers[opener] / total - want) < 0.015, openers
  # Reversing "4*4" changes nothing: a little under 15% of the eligible.
  assert 0.12 < swaps / eligible < 0.16, (swaps, eligible)


def test_varied_step_wording_rules():
  def vary(text, expr, seed):
    return phrasing.Varied(random.Random(seed))(text, expr)

  seen = set()
  for seed in range(400):
    text, expr = vary("She fills @ boxes.", "3*4*5", seed)
    seen.add((text, expr))
    assert text in ("She fills @ boxes.", "So, she fills @ boxes.",
                    "Then she fills @ boxes.")
    assert expr in ("3*4*5", "5*4*3")
    name_text, _ = vary("Ruby bakes @ rolls.", "6-2", seed)
    assert name_text.endswith("Ruby bakes @ rolls.")  # names keep capitals
    then_text, _ = vary("Then he has @.", "2+3", seed)
    assert not then_text.lower().startswith("then then")
    _, minus = vary("x @", "9-2", seed)
    assert minus == "9-2"  # only pure sums and products are reordered
  assert len(seen) == 6
  s = Solution()
  s.step(f"He pays {PLACEHOLDER}.", "12*3", money=True)
  s.step(f"{PLACEHOLDER} are left.", "50-36")
  assert s.text() == ("He pays 12*3 = $<<12*3=36>>36.\n"
                      "50-36 = <<50-36=14>>14 are left.\n#### 14")
  swap = lambda t, e: ("So, " + t, "*".join(reversed(e.split("*"))))
  assert s.text(swap) == (
      "So, He pays 3*12 = $<<3*12=36>>36.\n"
      "So, 50-36 = <<50-36=14>>14 are left.\n#### 14")


def test_varied_is_deterministic_and_bad_phrasing_is_refused():
  assert sg.generate(30, 5) == sg.generate(30, 5, phrasing="varied")
  assert sg.generate(30, 5) == sg.generate(30, 5)
  assert sg.generate(10, 5) == sg.generate(30, 5)[:10]
  for call in (lambda: sg.generate(3, 0, phrasing="fancy"),
               lambda: sg.draw("train", 0, 0, phrasing="fancy"),
               lambda: sg.make_problem("ages", random.Random(0),
                                       phrasing="Fixed")):
    with pytest.raises(ValueError, match="phrasing must be one of"):
      call()


def test_stream_draws_the_asked_phrasing():
  from flash_dllm_jax.tokenizer import Tokenizer
  from flash_dllm_train.data import encode_problems
  from flash_dllm_train.stream import StreamBatches
  from pathlib import Path
  tok = Tokenizer.from_dir(Path(__file__).resolve().parents[1]
                           / "checkpoints" / "synthetic-gsm-llada-16m")
  got = {}
  for ph in phrasing.PHRASINGS:
    want = encode_problems([sg.draw("train", 3, i, phrasing=ph)
                            for i in range(16)], tok, 320)
    with StreamBatches(tok, 320, 16, data_seed=3, phrasing=ph) as stream:
      rows = stream.rows(0)
    np.testing.assert_array_equal(rows.tokens_MxN, want.tokens_MxN)
    got[ph] = rows.tokens_MxN
  assert (got["fixed"] != got["varied"]).any()
  with pytest.raises(ValueError, match="phrasing must be one of"):
    StreamBatches(tok, 320, 16, phrasing="plain")
