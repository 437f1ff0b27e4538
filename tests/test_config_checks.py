"""Configs with NaN / inf numbers or non-positive sizes are refused at load
(a converted checkpoint's config.json) and at conversion (a Hugging Face
config.json), naming the key; an LLaDA2 tokenizer without its mask token is
the tokenizer's problem; LLaDA2's "does not fit" names the block tail."""

import json
import math
import shutil

import pytest

from flash_dllm_jax.checkpoint import load_config
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert.source import ConversionError, read_model
from flash_dllm_jax.strategies import build_sampler
from tests import llada2_fixtures
from tests.paths import TINY_CHECKPOINT


@pytest.mark.parametrize("key,value,why", [
    ("rope_theta", math.nan, "rope_theta must be a finite number > 0"),
    ("rms_norm_eps", math.inf, "rms_norm_eps must be a finite number > 0"),
    ("rms_norm_eps", 0.0, "rms_norm_eps must be a finite number > 0"),
    ("n_heads", 0, "n_heads must be a positive int, got 0"),
    ("d_model", True, "d_model must be a positive int, got True"),
    ("eos_token_id", "2", "eos_token_id must be an int"),
])
def test_a_converted_config_is_checked_at_load(tmp_path, key, value, why):
  ckpt = tmp_path / "ckpt"
  shutil.copytree(TINY_CHECKPOINT, ckpt)
  config = json.loads((ckpt / "config.json").read_text())
  (ckpt / "config.json").write_text(json.dumps({**config, key: value}))
  with pytest.raises(ValueError, match=why):
    load_config(ckpt)


@pytest.fixture(scope="module")
def llada2_hf(tmp_path_factory):
  path, _, config = llada2_fixtures.write_llada2(
      tmp_path_factory.mktemp("l2") / "hf", n_layers=1, n_shards=1)
  return path, config


def _with(src, dst, config=None, tokenizer=None):
  shutil.copytree(src, dst)
  if config is not None:
    (dst / "config.json").write_text(json.dumps(config))
  if tokenizer is not None:
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer))
  return dst


@pytest.mark.parametrize("key,value,why", [
    ("rope_theta", math.nan, "rope_theta must be a finite number, got nan"),
    ("rms_norm_eps", -math.inf, "rms_norm_eps must be a finite number"),
    ("num_attention_heads", 0, "num_attention_heads must be a positive int"),
    ("hidden_size", -4, "hidden_size must be a positive int"),
    ("num_experts", 0, "num_experts must be a positive int"),
])
def test_a_hugging_face_config_is_checked_at_conversion(llada2_hf, tmp_path,
                                                        key, value, why):
  path, config = llada2_hf
  src = _with(path, tmp_path / "src", {**config, key: value})
  with pytest.raises(ConversionError, match=f"config.json: .*{why}"):
    read_model(src, "float32")


def test_an_llada2_tokenizer_without_its_mask_token_is_named(llada2_hf,
                                                             tmp_path):
  path, config = llada2_hf
  tokenizer = json.loads((path / "tokenizer.json").read_text())
  tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"]
                               if t["content"] != "<|mask|>"]
  src = _with(path, tmp_path / "src",
              {k: v for k, v in config.items() if k != "mask_token_id"},
              tokenizer)
  with pytest.raises(ConversionError) as e:
    read_model(src, "float32")
  message = str(e.value)
  assert message.startswith(f"the tokenizer in {src}: ") and \
      "<|mask|>" in message and "config.json:" not in message, message


def test_llada2_does_not_fit_names_the_block_tail():
  sampler = build_sampler("llada2", "llada2", {"gen_length": 32,
                                               "block_length": 8})
  with pytest.raises(ValueError) as e:
    sampler.check_prompt(64, 100)
  assert str(e.value) == ("prompt (64) + gen_length (32) + the last block's "
                          "tail (7) exceeds max_seq_len 100")
