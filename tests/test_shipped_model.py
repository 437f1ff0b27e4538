"""The shipped default checkpoint loads and solves held-out word problems.

checkpoints/synthetic-gsm-llada-16m is the project's own LLaDA-format model
(15.5M parameters) trained on the synthetic GSM corpus; its model card gives
the training commands and its accuracy (95.7% / 96.0% on all 1000 held-out
problems at gen 192 / 256 on an H200, LLaDA sampler). The problems below are
held-out test problems 1 and 4 (data/synthetic_gsm/test.jsonl; none of
its questions occurs in the training stream), the two with five-step
solutions among the first five (the LLaDA sampler's uncached decode costs
each problem's whole sequence every step). Decoding is greedy with the
command line's defaults, so the answers are deterministic; every
`<<a op b=c>>` step of each worked solution must be right, not only the
final number.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import flash_dllm_jax
from flash_dllm_jax import cli
from flash_dllm_data.gsm_format import check_solution
from flash_dllm_jax.eval.tasks.gsm8k import extract_answer, target_of

ROOT = Path(__file__).resolve().parents[1]
TEST_SPLIT = ROOT / "data" / "synthetic_gsm" / "test.jsonl"
SOLVED = (1, 4)
# The shipped model computes more than it compiles: XLA's default level.
pytestmark = pytest.mark.usefixtures("optimised")


def test_default_checkpoint_is_the_trained_model():
  assert cli.DEFAULT_CHECKPOINT == (ROOT / "checkpoints"
                                    / "synthetic-gsm-llada-16m")
  params, config, tokenizer = flash_dllm_jax.load(cli.DEFAULT_CHECKPOINT)
  assert config.num_params() == 15_540_096 and tokenizer.vocab_size == 1024
  size = sum(f.stat().st_size for f in cli.DEFAULT_CHECKPOINT.rglob("*")
             if f.is_file())
  assert size < 25e6, size


def test_solves_held_out_problems_with_correct_worked_solutions():
  rows = [json.loads(line) for line in TEST_SPLIT.read_text().splitlines()]
  problems = [rows[i] for i in SOLVED]
  model = flash_dllm_jax.load(cli.DEFAULT_CHECKPOINT)
  out = flash_dllm_jax.generate(model, [p["question"] for p in problems],
                                chat=True, gen_length=192, steps=192,
                                block_length=32)
  for problem, text in zip(problems, out.texts):
    assert extract_answer(text) == target_of(problem["answer"]), text
    assert check_solution(text), text  # every step's arithmetic is right
    assert text.count("<<") >= 2  # a worked, multi-step solution
  assert np.all(out.steps_B > 0)


def test_answers_do_not_depend_on_the_other_prompts_lengths():
  """In bfloat16, a row padded to another prompt's longer bucket sums its
  keys in another order, which flipped a near-tied digit of held-out
  problem 15 (Flash-dLLM, gen 128) when problem 32 (one bucket longer)
  shared its batch. generate decodes each prompt-length bucket as its own
  batch, so the answer equals the one decoded alone."""
  from flash_dllm_jax.strategies import build_sampler
  rows = [json.loads(line) for line in TEST_SPLIT.read_text().splitlines()]
  model = flash_dllm_jax.load(cli.DEFAULT_CHECKPOINT)
  sampler = build_sampler("flash-dllm", "llada", {"gen_length": 128})
  together = flash_dllm_jax.generate(
      model, [rows[15]["question"], rows[32]["question"]], chat=True,
      sampler=sampler)
  alone = flash_dllm_jax.generate(model, [rows[15]["question"]], chat=True,
                                  sampler=sampler)
  assert together.texts[0] == alone.texts[0]
