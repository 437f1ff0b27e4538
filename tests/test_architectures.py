"""The architecture registry: lookups, the specs' contents, and that a new
architecture needs nothing but its spec."""

import dataclasses
import json
from pathlib import Path

import pytest

from flash_dllm_jax import architectures, strategies
from flash_dllm_jax.architectures import dream, llada
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import default_sampler
from flash_dllm_jax.convert import tables
from flash_dllm_jax.sampling import DreamSampler, LLaDASampler
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.tokenizer import build_tiny_tokenizer

REFERENCE = Path("/work/shared/reference")


def test_lookups():
  assert architectures.names() == ("llada", "dream")
  assert architectures.for_model_type("Dream") is dream.SPEC
  assert architectures.for_model_type("llada") is llada.SPEC
  with pytest.raises(ValueError, match="unknown model_type 'gpt2': expected "
                     "one of 'llada' .*'dream' \\(Dream-v0\\)"):
    architectures.for_model_type("gpt2")
  with pytest.raises(ValueError, match="unknown architecture 'x'; known: "
                     "llada, dream"):
    architectures.get("x")
  with pytest.raises(ValueError, match="arch must be one of"):
    ModelConfig.tiny("llada").replace(arch="x")


@pytest.mark.parametrize("spec,sampler", [(llada.SPEC, LLaDASampler),
                                          (dream.SPEC, DreamSampler)])
def test_specs(spec, sampler):
  config = ModelConfig.tiny(spec.name)
  assert config.spec is spec
  assert (config.qkv_bias, config.rope_in_float32, config.logits_shift) == (
      spec.qkv_bias, spec.rope_in_float32, spec.logits_shift)
  assert spec.name_table() is getattr(tables, spec.name.upper())
  assert spec.likelihood_masks == {"llada": "count", "dream": "rate"}[spec.name]
  assert type(default_sampler(config)) is sampler
  assert spec.default_strategy in strategies.strategies_for(spec.name)
  tok, _ = build_tiny_tokenizer(spec.name)
  assert tok.config["chat_template"] == spec.chat_template


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="no reference files")
@pytest.mark.parametrize("name,preset", [("llada-8b-instruct", "llada_8b"),
                                         ("dream-v0-instruct-7b", "dream_7b")])
def test_hf_readers_give_the_presets(name, preset):
  ref = REFERENCE / name
  config = ModelConfig.from_hf_config(
      ref / "config.json",
      generation_config=json.loads((ref / "generation_config.json")
                                   .read_text()))
  want = getattr(ModelConfig, preset)()
  assert config.replace(eot_token_id=want.eot_token_id) == want
  genuine = json.loads((ref / "tokenizer_config.json").read_text())
  assert genuine["chat_template"] == config.spec.chat_template


def test_a_new_architecture_is_one_spec(monkeypatch):
  """Registering a spec is all a family needs: config, tiny fixtures,
  HF config reading, default strategy and strategy checks follow it."""
  spec = dataclasses.replace(
      llada.SPEC, name="mini", hf_model_types=("mini-lm",), label="Mini",
      default_strategy="threshold", likelihood_masks="rate",
      read_hf_config=lambda hf: {**llada.read_hf_config(hf), "arch": "mini"})
  monkeypatch.setitem(architectures.ARCHITECTURES, "mini", spec)
  config = ModelConfig.tiny("mini")
  assert config.rope_in_float32 and not config.qkv_bias
  assert config.spec.likelihood_masks == "rate"  # lm-eval's noising
  with pytest.raises(ValueError, match="mini: likelihood_masks must be one "
                     "of \\('count', 'rate'\\), got 'tokens'"):
    dataclasses.replace(spec, likelihood_masks="tokens")
  assert isinstance(default_sampler(config), FastDLLMSampler)
  assert "llada" not in strategies.strategies_for("mini")
  assert "flash-dllm" in strategies.strategies_for("mini")
  with pytest.raises(ValueError, match="decodes llada checkpoints, not "
                     "'mini'"):
    strategies.build_sampler("llada", "mini", {})
  hf = json.loads((REFERENCE / "llada-8b-instruct" / "config.json")
                  .read_text()) if REFERENCE.is_dir() else None
  if hf is not None:
    assert ModelConfig.from_hf_config({**hf, "model_type": "mini-lm"}
                                      ).arch == "mini"
  tok, ids = build_tiny_tokenizer("mini")
  assert ids["mask_token_id"] == tok.mask_id
