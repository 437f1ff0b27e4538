"""The architecture registry: lookups, the specs' contents, and that a new
architecture is one folder (a fourth family from a temp folder alone)."""

import dataclasses
import json
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

import flash_dllm_jax
from flash_dllm_jax import architectures, roles, strategies
from flash_dllm_jax.architectures import dream, llada
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import convert_checkpoint, tables
from flash_dllm_jax.generate import default_sampler
from flash_dllm_jax import roles
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling.fast_dllm import FastDLLMSampler
from flash_dllm_jax.tokenizer import build_tiny_tokenizer

REFERENCE = Path("/work/shared/reference")


def test_lookups():
  assert {"llada", "dream"} <= set(architectures.names())
  assert architectures.for_model_type("Dream") is dream.SPEC
  assert architectures.for_model_type("llada") is llada.SPEC
  with pytest.raises(ValueError, match="unknown model_type 'gpt2': expected "
                     "one of .*'dream' \\(Dream-v0\\).*'llada' "):
    architectures.for_model_type("gpt2")
  with pytest.raises(ValueError, match="unknown architecture 'x'; known: "):
    architectures.get("x")
  with pytest.raises(ValueError, match="arch must be one of"):
    ModelConfig.tiny("llada").replace(arch="x")
  with pytest.raises(ValueError, match="unknown preset 'gpt-2'; known: "
                     ".*dream-7b.*llada-8b"):
    ModelConfig.preset("gpt-2")
  with pytest.raises(ValueError, match="already registered"):
    architectures.register(llada.SPEC.__class__(
        **{**llada.SPEC.__dict__, "name": "other"}))


@pytest.mark.parametrize("spec,sampler", [(llada.SPEC, LLaDASampler),
                                          (dream.SPEC, DreamSampler)])
def test_specs(spec, sampler):
  config = ModelConfig.tiny(spec.name)
  assert config.spec is spec
  assert (config.qkv_bias, config.rope_in_float32, config.logits_shift) == (
      spec.attention.qkv_bias, spec.attention.rope_in_float32,
      spec.logits_shift)
  assert spec.name_table() is getattr(
      __import__(f"flash_dllm_jax.architectures.{spec.name}.tensors",
                 fromlist=["TABLE"]), "TABLE")
  assert spec.likelihood_masks == {"llada": "count", "dream": "rate"}[spec.name]
  assert type(default_sampler(config)) is sampler
  assert spec.default_strategy in strategies.strategies_for(spec.name)
  tok, _ = build_tiny_tokenizer(spec.name)
  assert tok.config["chat_template"] == spec.chat_template


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="no reference files")
@pytest.mark.parametrize("name,preset", [("llada-8b-instruct", "llada-8b"),
                                         ("dream-v0-instruct-7b", "dream-7b")])
def test_hf_readers_give_the_presets(name, preset):
  ref = REFERENCE / name
  config = ModelConfig.from_hf_config(
      ref / "config.json",
      generation_config=json.loads((ref / "generation_config.json")
                                   .read_text()))
  want = ModelConfig.preset(preset)
  assert config.replace(eot_token_id=want.eot_token_id) == want
  genuine = json.loads((ref / "tokenizer_config.json").read_text())
  assert genuine["chat_template"] == config.spec.chat_template


def test_roles_replace_name_rules():
  """Every parameter's sharding and 8-bit role comes from the part that
  made it."""
  config = ModelConfig.tiny("dream")
  table = roles.table(config)
  assert table["layers_1/q_proj/kernel"] == roles.Role("columns",
                                                       "projection")
  assert table["layers_1/q_proj/bias"] == roles.Role("columns")
  assert table["embed"].shard == "vocab_rows"
  assert table["lm_head"].quantize == "head"
  assert "layers_0/attn_norm/scale" not in table  # undeclared: replicated
  assert roles.role_of(config, "layers_1/down_proj/kernel_q") == (
      roles.Role("columns", "projection"), True)
  assert not roles.quantizes(config, "lm_head")
  assert roles.quantizes(config.replace(quantize="int8", quantize_head=True),
                         "lm_head")
  # roles.py imports no model: the one whose init traces a config registers
  # it; a config no model registered gets one error naming its type.
  with pytest.raises(TypeError, match="no model registered for tuple"):
    roles.table(("not", "a config"))


TOY = '''
"""A toy family: Qwen-like names under 'net.', QK-norm, RoPE on half of
each head, decoded by the threshold strategy."""

from flash_dllm_jax.architectures import Architecture, AttentionSpec


def read_hf_config(hf, special):
  return dict(arch="toy", vocab_size=hf["vocab"], d_model=hf["width"],
              n_layers=hf["depth"], n_heads=hf["heads"], n_kv_heads=hf["heads"],
              head_dim=hf["width"] // hf["heads"], mlp_hidden=2 * hf["width"],
              rms_norm_eps=1e-6, rope_theta=1e4, rope_fraction=0.5,
              max_seq_len=256, mask_token_id=special["mask_token_id"],
              eos_token_id=special["eos_token_id"],
              pad_token_id=special["eos_token_id"])


def name_table():
  from flash_dllm_jax.convert.tables import (D, E, E_F, E_Q, F_E, KV_E, Q_E,
                                             V_E, rules)
  return rules("net.", [("emb", "embed", "identity", V_E),
                        ("out", "lm_head", "transpose", V_E),
                        ("norm", "final_norm/scale", "identity", E)]) + rules(
      "net.{layer}.", [
          ("n1", "layers_{layer}/attn_norm/scale", "identity", E),
          ("q", "layers_{layer}/q_proj/kernel", "transpose", Q_E),
          ("k", "layers_{layer}/k_proj/kernel", "transpose", KV_E),
          ("v", "layers_{layer}/v_proj/kernel", "transpose", KV_E),
          ("qn", "layers_{layer}/q_norm/scale", "identity", D),
          ("kn", "layers_{layer}/k_norm/scale", "identity", D),
          ("o", "layers_{layer}/attn_out/kernel", "transpose", E_Q),
          ("n2", "layers_{layer}/mlp_norm/scale", "identity", E),
          ("g", "layers_{layer}/gate_proj/kernel", "transpose", F_E),
          ("u", "layers_{layer}/up_proj/kernel", "transpose", F_E),
          ("d", "layers_{layer}/down_proj/kernel", "transpose", E_F)])


SPEC = Architecture(
    name="toy", hf_model_types=("toy-lm",), label="Toy",
    read_hf_config=read_hf_config, name_table=name_table,
    attention=AttentionSpec(qk_norm=True), logits_shift=0,
    default_strategy="threshold", samplers=("FastDLLMSampler",),
    chat_template="{{ messages[0]['content'] }}", likelihood_masks="rate",
    presets={"toy-1m": dict(vocab_size=384, d_model=128, n_layers=4,
                            n_heads=4, n_kv_heads=4, head_dim=32,
                            mlp_hidden=256, rms_norm_eps=1e-6,
                            rope_theta=1e4, max_seq_len=256,
                            mask_token_id=383, eos_token_id=380,
                            pad_token_id=380)},
    tiny_changes={"rope_fraction": 0.5},
    tiny_special_tokens=("<|endoftext|>", "<|mask|>"),
    tiny_tokenizer_config={"eos_token": "<|endoftext|>",
                           "pad_token": "<|endoftext|>",
                           "mask_token": "<|mask|>"})
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
  """The toy family registered from a temp folder alone (unregistered
  after the test)."""
  monkeypatch.setattr(architectures, "ARCHITECTURES",
                      dict(architectures.ARCHITECTURES))
  folder = tmp_path / "toy"
  folder.mkdir()
  (folder / "__init__.py").write_text(textwrap.dedent(TOY))
  return architectures.load_folder(folder)


def test_a_new_architecture_is_one_folder(toy, tmp_path):
  """Config, parts, tensor names, conversion, loading, the default and
  allowed strategies and the tokenizer all follow the folder's SPEC."""
  assert architectures.for_model_type("TOY-LM") is toy
  assert ModelConfig.preset("toy-1m").arch == "toy"
  config = ModelConfig.tiny("toy")
  assert config.rope_dim == config.head_dim // 2
  assert isinstance(default_sampler(config), FastDLLMSampler)
  assert strategies.strategies_for("toy") == [
      "threshold", "fast-dllm-prefix", "fast-dllm-dual"]
  with pytest.raises(ValueError, match="decodes llada checkpoints, not "
                     "'toy'"):
    strategies.build_sampler("llada", "toy", {})
  # A genuine-format HF directory of the family: its names, random weights.
  tok, ids = build_tiny_tokenizer("toy")
  src = tmp_path / "hf"
  src.mkdir()
  tok.save(src)
  (src / "config.json").write_text(json.dumps(dict(
      model_type="toy-lm", vocab=384, width=64, depth=2, heads=4)))
  config = ModelConfig.from_hf_config(json.loads(
      (src / "config.json").read_text()), special_ids=tok.special_ids())
  rng = np.random.default_rng(0)
  weights = {}
  for name in tables.expected_names(toy.name_table(), config):
    shape = tables.resolve(name, toy.name_table(), config).expected_shape
    scale = 1.0 if len(shape) == 1 else shape[-1] ** -0.5
    weights[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
  save_file(weights, str(src / "model.safetensors"))
  model = flash_dllm_jax.load(src, dtype="float32")
  assert model[1].arch == "toy" and "q_norm" in model[0]["layers_1"]
  convert_checkpoint(src, tmp_path / "c",
                     dtype="float32", progress=False)
  converted = flash_dllm_jax.load(tmp_path / "c")
  ids_BxN = rng.integers(0, 380, (2, 9))
  a = flash_dllm_jax.logits(model, ids_BxN).logits_BxNxV
  b = flash_dllm_jax.logits(converted, ids_BxN).logits_BxNxV
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  out = flash_dllm_jax.generate(model, [[5, 6, 7]], gen_length=8,
                                block_length=8, chat=False)
  assert out.tokens_BxG.shape == (1, 8)
  assert jax.tree.leaves(model[0])


def test_a_family_s_own_strategies_live_in_its_folder():
  """A strategy whose sampler decodes one family comes from that family's
  folder (its SPEC's `strategies`); sampling/ keeps the shared ones."""
  from flash_dllm_jax import strategies
  own = {s.name: spec.name for spec in architectures.ARCHITECTURES.values()
         if spec.strategies for s in spec.strategies()}
  for strategy in strategies.STRATEGIES.values():
    families = strategies.archs_of(strategy)
    module = strategy.sampler.__module__
    if len(families) == 1:
      assert own.get(strategy.name) == families[0], strategy.name
      assert module.startswith(
          "flash_dllm_jax.architectures." + families[0].replace("-", "_")), module
    else:
      assert strategy in strategies.SHARED, strategy.name
      assert module.startswith("flash_dllm_jax.sampling."), module


def test_a_family_registered_later_brings_its_strategies(monkeypatch):
  """A family with its own sampler is one folder and its SPEC's
  `strategies`: registering it adds them to the registry."""
  from flash_dllm_jax.sampling.strategy import Strategy
  monkeypatch.setattr(architectures, "ARCHITECTURES",
                      dict(architectures.ARCHITECTURES))
  own = Strategy("toy-own", LLaDASampler, fixed={"remasking": "random"})
  architectures.register(dataclasses.replace(
      llada.SPEC, name="toy-own-arch", hf_model_types=("toy-own-lm",),
      samplers=("LLaDASampler",), strategies=lambda: (own,)))
  assert strategies.STRATEGIES["toy-own"] is own
  assert strategies.strategies_for("toy-own-arch") == ["llada", "toy-own"]
  assert strategies.build_sampler("toy-own", "toy-own-arch", {}) == \
      LLaDASampler(remasking="random")
  monkeypatch.undo()
  assert "toy-own" not in strategies.STRATEGIES
