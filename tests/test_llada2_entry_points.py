"""LLaDA2.x through every entry point users call: the command line, the
lm-eval model (generation, and log-likelihood under the block-causal mask
against the NumPy restatement of modeling_llada2_moe.py) and the server
with the official client, each equal to offline `generate`."""

import json

import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_jax import cli
from flash_dllm_jax.convert import convert_checkpoint
from flash_dllm_jax.generate import answer_ids
from tests import llada2_fixtures, llada2_numpy
from tests.serve_case import check_answers_equal_offline

pytestmark = pytest.mark.slow  # one conversion, one server start

OPTIONS = dict(gen_length=16, block_length=8, steps=4, threshold=0.6)
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(converted checkpoint dir, HF weights, HF config.json dict)."""
  root = tmp_path_factory.mktemp("llada2-entry")
  hf, weights, config = llada2_fixtures.write_llada2(root / "hf", seed=4)
  convert_checkpoint(hf, root / "ckpt", dtype="float32", progress=False)
  return root / "ckpt", weights, config


@pytest.fixture(scope="module")
def model(converted):
  return fdj.load(converted[0])


def offline_ids(model, prompt: str, chat: bool) -> list[int]:
  out = fdj.generate(model, [prompt], strategy="llada2", chat=chat,
                     **OPTIONS)
  return answer_ids(out.tokens_BxG[0], model[1])


def test_command_line(converted, model, capsys):
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()]
  code = cli.main(["generate", "--checkpoint", str(converted[0]),
                   "--strategy", "llada2", *flags, "--no-chat",
                   "--prompt", PROMPT, "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err
  [result] = json.loads(out.out)["results"]
  assert result["token_ids"] == offline_ids(model, PROMPT, chat=False)


def test_lm_eval_generation_and_block_causal_likelihood(converted, model):
  from lm_eval.api.instance import Instance
  from flash_dllm_jax.lm_eval.model import FlashDLLMJax
  args = ",".join(f"{k}={v}" for k, v in OPTIONS.items())
  lm = FlashDLLMJax.create_from_arg_string(
      f"pretrained={converted[0]},strategy=llada2,{args},mc_num=4,"
      "batch_size=4")
  [text] = lm.generate_until([Instance(
      "generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": 16}), 0)])
  tokenizer = model[2]
  assert text == tokenizer.decode(offline_ids(model, PROMPT, chat=False))

  [(value, _)] = lm.loglikelihood([Instance(
      "loglikelihood", {}, ("Mixture of experts route", " each token"), 0)])
  prefix, target = lm._encode_pair("Mixture of experts route", " each token")
  masks, weights = lm.draw_masks(0, len(target))
  seq = np.array(prefix + target)
  noisy = np.repeat(seq[None], len(masks), 0)
  noisy[:, len(prefix):][masks] = model[1].mask_token_id
  logits = llada2_numpy.forward(converted[1], converted[2], noisy,
                                block_length=OPTIONS["block_length"])
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  total = sum(-logp[m, len(prefix) + j, target[j]] * w
              for m, (mask, w) in enumerate(zip(masks, weights))
              for j in np.flatnonzero(mask))
  np.testing.assert_allclose(value, -total / len(masks), rtol=1e-4)
  # Under full attention the estimate differs: the mask is in force.
  full = llada2_numpy.forward(converted[1], converted[2], noisy)
  assert not np.allclose(full, logits)


def test_server_answers_equal_offline_generate(converted, model, tmp_path):
  check_answers_equal_offline(converted[0], "llada2", OPTIONS,
                              lambda p, chat: offline_ids(model, p, chat),
                              PROMPT, tmp_path / "server.log")
