"""The module-scoped fixture the training tests share."""

import pytest

from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_data.tokenizer_builder import build_tokenizer, corpus_texts
from flash_dllm_jax.config import ModelConfig
from flash_dllm_train.data import encode_problems


@pytest.fixture(scope="module")
def setup():
  """A tokenizer, a tiny float32 config and training rows of short problems."""
  problems = [p for p in sg.generate(400, 0) if p["steps"] == 2]
  tok, ids = build_tokenizer(corpus_texts(problems), vocab_size=512)
  config = ModelConfig.tiny("llada", vocab_size=512, **ids)
  rows = encode_problems(problems, tok, 128)
  return tok, config, rows, problems
