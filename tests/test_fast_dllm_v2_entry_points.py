"""Fast-dLLM v2 through every entry point users call: the command line,
the lm-eval model (generation, and log-likelihood under the block-causal
mask with the token shift against transformers' Qwen2 given that mask) and
the server with the official client, each equal to offline `generate`."""

import json

import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_jax import cli
from flash_dllm_jax.convert import convert_checkpoint
from flash_dllm_jax.generate import answer_ids
from tests import fast_dllm_v2_fixtures, sdar_fixtures
from tests.serve_case import check_answers_equal_offline

pytestmark = pytest.mark.slow  # one conversion, one server start

OPTIONS = dict(gen_length=16, block_length=4, small_block_length=2,
               threshold=0.5, temperature=0.0)
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(converted checkpoint dir, HF weights, HF config.json dict)."""
  root = tmp_path_factory.mktemp("fast-dllm-v2-entry")
  hf, weights, config = fast_dllm_v2_fixtures.write_fast_dllm_v2(
      root / "hf", seed=4)
  convert_checkpoint(hf, root / "ckpt", dtype="float32", progress=False)
  return root / "ckpt", weights, config


@pytest.fixture(scope="module")
def model(converted):
  return fdj.load(converted[0])


def offline_ids(model, prompt: str, chat: bool) -> list[int]:
  out = fdj.generate(model, [prompt], strategy="fast-dllm-v2", chat=chat,
                     **OPTIONS)
  return answer_ids(out.tokens_BxG[0], model[1])


def test_command_line(converted, model, capsys):
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()]
  code = cli.main(["generate", "--checkpoint", str(converted[0]), *flags,
                   "--no-chat", "--prompt", PROMPT, "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err  # strategy: the family's default, fast-dllm-v2
  [result] = json.loads(out.out)["results"]
  assert result["token_ids"] == offline_ids(model, PROMPT, chat=False)


def test_lm_eval_generation_and_block_causal_likelihood(converted, model):
  from lm_eval.api.instance import Instance
  from flash_dllm_jax.lm_eval.model import FlashDLLMJax
  args = ",".join(f"{k}={v}" for k, v in OPTIONS.items())
  lm = FlashDLLMJax.create_from_arg_string(
      f"pretrained={converted[0]},strategy=fast-dllm-v2,{args},mc_num=4,"
      "batch_size=4")
  [text] = lm.generate_until([Instance(
      "generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": 16}), 0)])
  assert text == model[2].decode(offline_ids(model, PROMPT, chat=False))

  [(value, _)] = lm.loglikelihood([Instance(
      "loglikelihood", {}, ("A diffusion language model", " fills"), 0)])
  prefix, target = lm._encode_pair("A diffusion language model", " fills")
  masks, weights = lm.draw_masks(0, len(target))
  seq = np.array(prefix + target)
  noisy = np.repeat(seq[None], len(masks), 0)
  noisy[:, len(prefix):][masks] = model[1].mask_token_id
  oracle = fast_dllm_v2_fixtures.torch_model(converted[1], converted[2])
  logits = sdar_fixtures.torch_logits(oracle, noisy, OPTIONS["block_length"])
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  # the token shift: position i is predicted by row i - 1
  total = sum(-logp[m, len(prefix) + j - 1, target[j]] * w
              for m, (mask, w) in enumerate(zip(masks, weights))
              for j in np.flatnonzero(mask))
  np.testing.assert_allclose(value, -total / len(masks), rtol=1e-4)


def test_server_answers_equal_offline_generate(converted, model, tmp_path):
  check_answers_equal_offline(converted[0], "fast-dllm-v2", OPTIONS,
                              lambda p, chat: offline_ids(model, p, chat),
                              PROMPT, tmp_path / "server.log")
