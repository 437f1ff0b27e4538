"""The shipped LLaDA2-format model loads and solves word problems.

checkpoints/synthetic-gsm-llada2-moe is the project's own block-diffusion
MoE (17.6M parameters, 8 routed experts, block 32) trained on the synthetic
GSM corpus with the block-diffusion objective; its model card gives the
recipe and its accuracy. Greedy decoding, so the answers are
deterministic. The README's problem and held-out problems 4 and 7
(data/synthetic_gsm/test.jsonl) are among those `llada2-flash` solves:
every `<<a op b=c>>` step of those must be right. Their chat prompts lie
in one prompt bucket: decoded alone, they run one compiled program.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import flash_dllm_jax
from flash_dllm_data.gsm_format import check_solution
from flash_dllm_jax.eval.tasks.gsm8k import extract_answer, target_of
from flash_dllm_jax.strategies import build_sampler

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "synthetic-gsm-llada2-moe"
TEST_SPLIT = ROOT / "data" / "synthetic_gsm" / "test.jsonl"
README_PROBLEM = ("Ruby bakes 6 trays of rolls with 7 on each tray. She eats "
                  "7 of them and gives 3 to Henry. She packs the rest into "
                  "boxes of 4. How many boxes does she fill?")
FLASH_OPTIONS = {"gen_length": 192}


def test_is_a_small_llada2_moe():
  params, config, tokenizer = flash_dllm_jax.load(CHECKPOINT)
  assert config.arch == "llada2" and config.moe.n_experts >= 8
  assert config.num_params() == 17_584_328 and tokenizer.vocab_size == 1024
  assert tokenizer.mask_id == config.mask_token_id
  size = sum(f.stat().st_size for f in CHECKPOINT.rglob("*") if f.is_file())
  assert size < 60e6, size
  assert "expert_bias" in params["layers_1"]["moe"]


@pytest.fixture(scope="module")
def model():
  return flash_dllm_jax.load(CHECKPOINT)


@pytest.fixture(scope="module")
def flash_alone(model):
  """(problems, targets, llada2-flash's output for each problem decoded
  alone at gen 192): the answers the solving test checks and the server
  must reproduce."""
  rows = [json.loads(line) for line in TEST_SPLIT.read_text().splitlines()]
  problems = [README_PROBLEM, rows[4]["question"], rows[7]["question"]]
  targets = ["8", target_of(rows[4]["answer"]), target_of(rows[7]["answer"])]
  sampler = build_sampler("llada2-flash", "llada2", FLASH_OPTIONS)
  outs = [flash_dllm_jax.generate(model, [p], chat=True, sampler=sampler)
          for p in problems]
  return problems, targets, outs


def test_solves_with_llada2_flash_and_the_cache_is_exact(model, flash_alone):
  """llada2-flash solves the three problems; llada2 with the block cache
  decodes the README problem as re-running the whole window each step
  does, token for token and call for call (one row: rows in a batch with
  the cache are tests/test_llada2_cache.py's claim), and solves it."""
  problems, targets, outs = flash_alone
  texts = [out.texts[0] for out in outs]
  assert [extract_answer(t) for t in texts] == targets, texts
  for text in texts:
    assert check_solution(text) and text.count("<<") >= 2, text
  outs = [flash_dllm_jax.generate(model, problems[:1], chat=True, sampler=(
      build_sampler("llada2", "llada2", {"gen_length": 192,
                                         "block_cache": cached})))
          for cached in (True, False)]
  np.testing.assert_array_equal(outs[0].tokens_BxG, outs[1].tokens_BxG)
  np.testing.assert_array_equal(outs[0].forwards_B, outs[1].forwards_B)
  assert extract_answer(outs[0].texts[0]) == "8"


def test_server_llada2_flash_answers_equal_offline(tmp_path, model,
                                                   flash_alone):
  """Three chats on two slots (one refill mid-decode), sent at once through
  the official client: each answer equals offline generate's alone."""
  import concurrent.futures
  from flash_dllm_jax.generate import answer_ids
  from tests.serve_case import Server
  prompts, _, outs = flash_alone
  want = [answer_ids(out.tokens_BxG[0], model[1]) for out in outs]
  server = Server(CHECKPOINT, "llada2-flash", FLASH_OPTIONS, "--batch-size",
                  "2", "--max-prompt-tokens", "160",
                  log_path=tmp_path / "server.log")
  try:
    server.wait_ready()
    client = server.client()
    name = client.models.list().data[0].id
    ask = lambda p: client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": p}])
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
      got = list(pool.map(ask, prompts))
    assert [g.choices[0].token_ids for g in got] == want
    assert extract_answer(got[0].choices[0].message.content) == "8"
  finally:
    server.close()
