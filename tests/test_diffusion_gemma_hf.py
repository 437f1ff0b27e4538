"""DiffusionGemma's Hugging Face layout (vLLM's tensor names): a directory
written from the tiny official checkpoint loads to the same tree, converts
to Google's format through scripts/convert_hf.py, and bad input fails
with one line."""

import json
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from flash_dllm_jax import checkpoint
from flash_dllm_jax.architectures.diffusion_gemma import tensors
from flash_dllm_jax.convert import ConversionError, convert_checkpoint
from tests.paths import ROOT

REF = ROOT / "tests" / "reference" / "diffusion_gemma"
sys.path.insert(0, str(ROOT / "scripts"))
import convert_hf  # noqa: E402


def _hf_config(config):
  """A DiffusionGemma config.json of `config` in HF's keys."""
  kinds = {"local": "sliding_attention", "global": "full_attention"}
  return {
      "model_type": "diffusion_gemma", "self_conditioning_size":
      config.sc_width, "text_config": {
          "vocab_size": config.vocab_size, "hidden_size": config.d_model,
          "intermediate_size": config.mlp_hidden,
          "num_attention_heads": config.n_heads,
          "num_key_value_heads": config.n_kv_heads,
          "num_global_key_value_heads": config.n_global_kv_heads,
          "head_dim": config.head_dim,
          "global_head_dim": config.global_head_dim,
          "layer_types": [kinds[k] for k in config.layer_kinds],
          "sliding_window": config.sliding_window,
          "final_logit_softcapping": config.final_logit_softcap,
          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
          "enable_moe_block": True, "num_experts": config.moe_experts,
          "top_k_experts": config.moe_top_k,
          "moe_intermediate_size": config.moe_hidden,
          "rope_parameters": {
              "sliding_attention": {"rope_theta": config.local_rope_base},
              "full_attention": {
                  "rope_theta": config.global_rope_base,
                  "partial_rotary_factor": config.global_rope_fraction}}}}


@pytest.fixture(scope="module")
def official():
  return checkpoint.load(REF / "tiny", dtype="float32")[:2]


def _write_hf(d, params, config, drop=None):
  d.mkdir()
  arrays = tensors.to_hf(params, config)
  if drop:
    del arrays[drop]
  save_file(arrays, str(d / "model.safetensors"))
  (d / "config.json").write_text(json.dumps(_hf_config(config)))


def test_hf_layout_loads_and_converts(official, tmp_path):
  params, config = official
  hf = tmp_path / "hf"
  _write_hf(hf, params, config)
  loaded, cfg, _ = checkpoint.load(hf, dtype="float32")
  assert cfg == config.replace(max_seq_len=cfg.max_seq_len)
  assert cfg.k_eq_v_global  # read from the weights: no global v_proj
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  # scripts/convert_hf.py writes Google's format, which loads as is.
  out = tmp_path / "google"
  assert convert_hf.main([str(hf), str(out), "--dtype", "float32"]) == 0
  assert (out / "config.json").is_file() and not (out / "manifest.json"
                                                  ).exists()
  again, cfg2, _ = checkpoint.load(out)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, again, params)
  with pytest.raises(ConversionError, match="8-bit conversion"):
    convert_checkpoint(hf, tmp_path / "q", quantize="int8")


def test_hf_errors_are_one_line(official, tmp_path):
  params, config = official
  name = "model.encoder.language_model.layers.1.self_attn.q_proj.weight"
  bad = tmp_path / "bad"
  _write_hf(bad, params, config, drop=name)
  with pytest.raises(ValueError, match=f"lacks tensor '{name}'"):
    checkpoint.load(bad)
  meta = json.loads((bad / "config.json").read_text())
  meta["text_config"]["hidden_activation"] = "silu"
  (bad / "config.json").write_text(json.dumps(meta))
  with pytest.raises(ConversionError, match="unsupported DiffusionGemma "
                     "config values: hidden_activation='silu'"):
    convert_checkpoint(bad, tmp_path / "out")
  assert not (tmp_path / "out").exists()
