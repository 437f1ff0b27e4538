"""Fast-dLLM v2: genuine-format loading and conversion, the model against
transformers' Qwen2 under the block-causal mask (with its token shift), and
the published config and tensor names."""

import json

import jax
import numpy as np
import pytest
from flax import traverse_util

import flash_dllm_jax as fdj
from flash_dllm_jax import architectures
from flash_dllm_jax.architectures.fast_dllm_v2.sampler import FastDLLMV2Sampler
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import tables
from flash_dllm_jax.model import init_params
from tests import fast_dllm_v2_fixtures as fixtures
from tests import fast_dllm_v2_reference, sdar_fixtures
from tests.test_sampling import check_continuous_equals_alone

BL = 4


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """(HF directory, its weights, its config.json dict)."""
  return fixtures.write_fast_dllm_v2(
      tmp_path_factory.mktemp("fast_dllm_v2") / "hf", seed=1, stop_like=313)


@pytest.fixture(scope="module")
def model(hf):
  return fdj.load(hf[0], dtype="float32")


@pytest.fixture(scope="module")
def oracle(hf):
  return fixtures.torch_model(hf[1], hf[2])


def test_config_tokens_and_chat_come_from_the_genuine_files(model):
  params, config, tok = model
  assert config.arch == "fast_dllm_v2" and config.logits_shift == 1
  assert config.spec.attention.mask == "block_causal"
  assert config.mask_token_id == tok.token_to_id("|<MASK>|")
  assert config.stop_token_ids == (tok.token_to_id("<|im_end|>"),)
  assert params["layers_0"]["k_proj"]["bias"].shape == (16,)
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == ("<|im_start|>system\nYou are a helpful assistant."
                  "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n")


@pytest.mark.parametrize("block_length", [None, BL])
def test_forward_matches_transformers_qwen2_under_the_mask(model, oracle,
                                                           block_length):
  """Raw logits rows equal Qwen2's under eval_block_diff_mask (row i
  predicts position i + 1: config.logits_shift), with and without left
  padding (positions and blocks count from a row's first token)."""
  sdar_fixtures.check_forward(model, oracle, block_length)


def test_converted_and_8bit_checkpoints(hf, model, tmp_path):
  sdar_fixtures.check_conversions(hf[0], model, tmp_path, BL)


def test_bad_configs_get_one_clear_error(hf):
  with pytest.raises(ValueError, match="unsupported Fast-dLLM v2 config "
                     "values: tie_word_embeddings=True"):
    ModelConfig.from_hf_config({**hf[2], "tie_word_embeddings": True})
  with pytest.raises(ValueError, match="unsupported Fast-dLLM v2 config "
                     r"values: layer_types=\['sliding_attention'\]"):
    ModelConfig.from_hf_config({**hf[2], "layer_types": [
        "full_attention", "sliding_attention"]})
  with pytest.raises(ValueError, match="mask token id 151665 is outside "
                     "the vocabulary of 320"):
    ModelConfig.from_hf_config(hf[2])  # no tokenizer: the genuine constant


def test_the_published_config_and_tensor_names():
  """The published config reads as the preset (mask 151665, stop
  <|im_end|>), and the 339 tensor names of its index map one-to-one onto
  the model's parameters; the bf16 size is two bytes a parameter."""
  config = ModelConfig.from_hf_config(fixtures.REFERENCE / "config.json")
  assert config == ModelConfig.preset("fast-dllm-v2-7b")
  assert config.stop_token_ids == (151645,)
  index = json.loads((fixtures.REFERENCE / "model.safetensors.index.json")
                     .read_text())
  names = sorted(index["weight_map"])
  assert len(names) == 339
  table = architectures.get("fast_dllm_v2").name_table()
  assert names == sorted(tables.expected_names(table, config))
  shapes = {}
  for name in names:
    shapes.update(tables.resolve(name, table, config).stored_shapes())
  init = traverse_util.flatten_dict(jax.eval_shape(
      lambda: init_params(config, jax.random.key(0))), sep="/")
  assert shapes == {p: a.shape for p, a in init.items()}
  assert 2 * config.num_params() == index["metadata"]["total_size"]


@pytest.mark.parametrize("threshold", [0.3, 1.0])
def test_generate_equals_the_reference_loop(model, oracle, threshold):
  """Each row of a batch of four prompt lengths (mid-block and on a block
  boundary) gives the reference's whole answer (through the block where a
  step committed the stop id, or all blocks) and model calls for that
  prompt alone; threshold 1.0: one token a step."""
  config = model[1]
  opts = dict(gen_length=16, block_length=BL, small_block_length=2,
              threshold=threshold)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 14)]
  out = fdj.generate(model, prompts, strategy="fast-dllm-v2", chat=False,
                     temperature=0.0, **opts)
  logits_fn = lambda x: sdar_fixtures.torch_logits(oracle, x, BL)
  stops = config.stop_token_ids
  ended = 0
  for i, prompt in enumerate(prompts):
    ref = fast_dllm_v2_reference.generate(
        logits_fn, prompt, config.mask_token_id, stops, **opts)
    assert out.tokens_BxG[i][:len(ref.x)].tolist() == ref.x.tolist(), i
    boundary = len(prompt) % BL == 0
    assert out.forwards_B[i] == (ref.denoise + ref.store
                                 + ref.prefill * boundary), i
    ended += ref.trailing == 0
  assert 0 < ended < len(prompts)  # answers ending at a stop id, and not


def test_sub_block_cache_equals_the_reference_loop(model, oracle):
  """With the sub-block cache (use_block_cache) each row gives the
  reference's answer and model calls: sub-block forwards attend to the
  block's K/V of its last whole-block forward, as there."""
  config = model[1]
  opts = dict(gen_length=16, block_length=BL, small_block_length=2,
              threshold=0.3)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 14)]
  out = fdj.generate(model, prompts, strategy="fast-dllm-v2", chat=False,
                     temperature=0.0, sub_block_cache=True, **opts)
  plain = fdj.generate(model, prompts, strategy="fast-dllm-v2", chat=False,
                       temperature=0.0, **opts)
  for i, prompt in enumerate(prompts):
    ref = fast_dllm_v2_reference.generate(
        lambda x: sdar_fixtures.torch_logits(oracle, x, BL), prompt,
        config.mask_token_id, config.stop_token_ids, **opts,
        use_block_cache=True,
        window_fn=lambda x: fixtures.torch_window(oracle, x, BL),
        sub_fn=lambda kv, ids, first: fixtures.torch_sub_block(
            oracle, kv, ids, first))
    assert out.tokens_BxG[i][:len(ref.x)].tolist() == ref.x.tolist(), i
    boundary = len(prompt) % BL == 0
    assert out.forwards_B[i] == (ref.denoise + ref.store
                                 + ref.prefill * boundary), i
  assert (out.tokens_BxG != plain.tokens_BxG).any()  # the cache is stale


def test_continuous_batching_equals_each_request_alone():
  """Four requests through two slots in one compiled loop (a refilled slot
  runs its window again), with the sub-block cache at temperature 0.8:
  every answer, model call count and step count equals that request
  alone."""
  sampler = FastDLLMV2Sampler(gen_length=8, block_length=BL,
                              small_block_length=2, threshold=0.5,
                              sub_block_cache=True, temperature=0.8)
  check_continuous_equals_alone("fast_dllm_v2", sampler, 1.2, [4, 19, 9, 6])


def test_bad_options_get_one_clear_error():
  with pytest.raises(ValueError, match=r"gen_length \(18\) must be a "
                     r"multiple of block_length \(4\)"):
    FastDLLMV2Sampler(gen_length=18, block_length=4)
  with pytest.raises(ValueError, match=r"block_length \(4\) must be a "
                     r"multiple of small_block_length \(3\)"):
    FastDLLMV2Sampler(gen_length=16, block_length=4, small_block_length=3)
  with pytest.raises(ValueError, match="decodes fast_dllm_v2 checkpoints, "
                     "not 'sdar'"):
    fdj.build_sampler("fast-dllm-v2", "sdar", {})
