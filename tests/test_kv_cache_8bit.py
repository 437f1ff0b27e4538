"""The decode with an 8-bit KV cache (FlashDLLMSampler.kv_cache_dtype):
the cache it carries is 8-bit, a row's tokens do not depend on its batch,
and the shipped model still gives held-out problems' right answers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flash_dllm_jax
from flash_dllm_jax import cli
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.eval.tasks.gsm8k import extract_answer, target_of
from flash_dllm_jax.generate import generate
from flash_dllm_jax.model.transformer import init_params
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.strategies import build_sampler
from tests.paths import ROOT
from tests.test_sampling import random_prompts

FP8 = FlashDLLMSampler(gen_length=24, block_m=4, track_num=2, mask_num=2,
                       threshold=0.9, verify=True, gamma=0.4,
                       kv_cache_dtype="float8_e4m3fn")
TEST_SPLIT = ROOT / "data" / "synthetic_gsm" / "test.jsonl"


@pytest.fixture(scope="module")
def tiny():
  config = ModelConfig.tiny("llada", dtype="bfloat16")
  return config, init_params(config, jax.random.key(7), head_init_scale=8.0)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "int8"])
def test_decode_carries_an_8bit_cache(tiny, fmt):
  config, params = tiny
  model = SequenceModel.for_batch(config, params, jnp.ones((2, 40), bool))
  sampler = build_sampler("flash-cache", "llada", {"kv_cache_dtype": fmt})
  cache = jax.eval_shape(lambda: sampler.init_aux(
      model, jnp.zeros((2, 40), jnp.int32))).cache
  assert {x.dtype for x in cache.k + cache.v} == {jnp.dtype(fmt)}
  assert cache.k_scale[0].shape == (2, 40, config.n_kv_heads)
  auto = jax.eval_shape(lambda: build_sampler("flash-cache", "llada", {})
                        .init_aux(model, jnp.zeros((2, 40), jnp.int32))).cache
  assert auto.k[0].dtype == jnp.bfloat16 and auto.k_scale is None


def test_8bit_decode_is_batch_invariant(tiny):
  """Prompts 4-7 (one bucket) decode to the same tokens, forwards and steps
  beside prompts 0-3 as beside prompts 8-11 in another order (one compiled
  program: the batch's size is the same)."""
  config, params = tiny
  lengths = np.random.default_rng(3).integers(8, 33, 12).tolist()
  prompts = random_prompts(31, lengths)
  first = generate(params, prompts[:8], config=config, sampler=FP8)
  second = generate(params, prompts[4:8] + prompts[8:][::-1], config=config,
                    sampler=FP8)
  for a, b in ((first.tokens_BxG, second.tokens_BxG),
               (first.forwards_B, second.forwards_B),
               (first.steps_B, second.steps_B)):
    np.testing.assert_array_equal(a[4:], b[:4])


def test_shipped_model_answers_with_an_8bit_cache():
  """Held-out problems 0, 1 and 4 (one prompt bucket, as in
  test_shipped_model): flash-dllm with a float8 cache gives their right
  final answers (one compiled program; the bfloat16 cache's decode of the
  shipped model is checked in test_shipped_model and test_readme)."""
  rows = [json.loads(line) for line in TEST_SPLIT.read_text().splitlines()]
  problems = [rows[i] for i in (0, 1, 4)]
  model = flash_dllm_jax.load(cli.DEFAULT_CHECKPOINT)
  out = flash_dllm_jax.generate(
      model, [p["question"] for p in problems], chat=True,
      strategy="flash-dllm", gen_length=128, kv_cache_dtype="float8_e4m3fn")
  assert [extract_answer(t) for t in out.texts] == [
      target_of(p["answer"]) for p in problems]


def test_server_plans_and_serves_an_8bit_cache(tmp_path):
  """`serve --kv-cache-dtype float8_e4m3fn`: /health's slot plan counts
  the 8-bit cache (and its scales) and a completion is answered."""
  import openai

  from flash_dllm_jax.checkpoint import load_config
  from flash_dllm_jax.serve import memory_plan
  from tests.paths import TINY_CHECKPOINT
  from tests.serve_case import Server
  options = {"gen_length": 32, "block_m": 8,
             "kv_cache_dtype": "float8_e4m3fn"}
  server = Server(TINY_CHECKPOINT, "flash-dllm", options, "--batch-size",
                  "2", "--max-prompt-tokens", "64",
                  log_path=tmp_path / "server.log")
  try:
    health = server.wait_ready()
    config = load_config(TINY_CHECKPOINT)
    slot = health["slot_plan"]["slot_bytes"]
    assert slot == memory_plan.slot_bytes(config, 64 + 32, "float8_e4m3fn")
    assert slot < memory_plan.slot_bytes(config, 64 + 32)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model=health["model"],
                                    prompt=[7, 8, 9, 10], max_tokens=32)
    assert out.usage.prompt_tokens == 4
    assert 0 < out.usage.completion_tokens <= 32
  finally:
    server.close()
