"""8-bit checkpoints: convert_checkpoint(quantize=) against load(quantize=)
and a save/load round trip, Dream's biases, the CLI flags, old configs and
the errors of bad inputs."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import checkpoint, cli, quantize
from flash_dllm_jax.convert import ConversionError, convert_checkpoint
from flash_dllm_jax.forward import logits
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params
from tests import hf_fixtures
from tests.paths import TINY_CHECKPOINT
from tests.test_quantize import _tiny_pair, tree_equal

@pytest.mark.parametrize("fmt,head,embedding", [
    ("fp8", True, True), ("int8", False, False), ("int8", False, True)])
def test_load_quantize_equals_the_converted_quantized_checkpoint(
    tmp_path, capsys, fmt, head, embedding):
  """HF dir -> convert_checkpoint(quantize=) -> load, against load(HF dir,
  quantize=), load(bf16 orbax copy, quantize=) and save -> load of the
  loaded tree: bit for bit, and the config records the format."""
  asked = dict(quantize=fmt, quantize_head=head, quantize_embedding=embedding)
  src, _ = hf_fixtures.write_llada(tmp_path / "hf")
  convert_checkpoint(src, tmp_path / "q", progress=True, **asked)
  said = capsys.readouterr().out
  parts = ["projections"] + ["LM head"] * head + ["embedding"] * embedding
  assert f"{', '.join(parts)} in {fmt}" in said, said
  convert_checkpoint(src, tmp_path / "bf16", progress=False)
  stored, config, _ = checkpoint.load(tmp_path / "q")
  assert (config.quantize, config.quantize_head,
          config.quantize_embedding) == (fmt, head, embedding)
  assert checkpoint.load_config(tmp_path / "q") == config
  assert isinstance(stored["embed"], dict) == embedding
  for other in (tmp_path / "hf", tmp_path / "bf16"):
    got, got_config, _ = checkpoint.load(other, **asked)
    assert got_config == config and tree_equal(got, stored)
  # the same with its own config: asking for what it stores is fine
  again, _, _ = checkpoint.load(tmp_path / "q", **asked)
  assert tree_equal(again, stored)
  checkpoint.save(tmp_path / "saved", stored, config)
  saved, saved_config, _ = checkpoint.load(tmp_path / "saved")
  assert saved_config == config and tree_equal(saved, stored)


def test_dream_checkpoint_quantizes_with_its_biases(tmp_path):
  src, _ = hf_fixtures.write_dream(tmp_path / "dream", n_layers=2)
  params, config, tokenizer = checkpoint.load(src)
  qparams, qconfig, _ = checkpoint.load(src, quantize="int8")
  assert qconfig.arch == "dream" and qconfig.quantize == "int8"
  q = qparams["layers_0"]["q_proj"]
  assert set(q) == {"kernel_q", "scale", "bias"}
  np.testing.assert_array_equal(q["bias"], params["layers_0"]["q_proj"]["bias"])
  ids = np.asarray([tokenizer.encode("a b c d e f")], np.int32)
  ref = logits((params, config, tokenizer), ids).logits_BxNxV
  got = logits((qparams, qconfig, tokenizer), ids).logits_BxNxV
  assert float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref)) < 0.02


def test_cli_generate_with_quantize(capsys, monkeypatch):
  loaded = []

  def recording_load(*args, **kwargs):
    loaded.append(load(*args, **kwargs))
    return loaded[-1]

  load = cli.load
  monkeypatch.setattr(cli, "load", recording_load)
  argv = ["generate", "--checkpoint", str(TINY_CHECKPOINT), "--quantize",
          "fp8", "--quantize-head", "--quantize-embedding", "--gen-length",
          "8", "--steps", "4", "--block-length", "8", "--prompt", "Hi",
          "--output", "json", "--no-progress"]
  assert cli.main(argv) == 0
  out = capsys.readouterr()
  assert '"text"' in out.out
  params, config, _ = loaded[-1]
  assert (config.quantize, config.quantize_head,
          config.quantize_embedding) == ("fp8", True, True)
  assert params["embed"]["kernel_q"].dtype == jnp.float8_e4m3fn
  assert cli.main(argv[:4] + ["int8-g128"] + argv[5:]) == 1
  err = capsys.readouterr().err
  assert "int8-g128 needs its input size 64 divisible by 128" in err


def test_bad_inputs_each_get_their_message(tmp_path):
  config, params, qconfig, qparams = _tiny_pair("int8", embedding=True)
  with pytest.raises(ValueError, match="unknown quantization format 'int4'; "
                     "known formats: fp8, int8, int8-g128"):
    quantize.quantize_params(params, types.SimpleNamespace(quantize="int4"))
  with pytest.raises(ValueError, match="quantize must be None or one of"):
    config.replace(quantize="int4")
  with pytest.raises(ValueError, match="quantize_head=True needs"):
    config.replace(quantize_head=True)
  with pytest.raises(ValueError, match="quantize_embedding=True needs a "
                     "quantize format"):
    config.replace(quantize_embedding=True)
  with pytest.raises(ValueError, match="quantize_embedding must be a bool"):
    qconfig.replace(quantize_embedding="yes")
  with pytest.raises(ValueError, match="^quantize_embedding needs a quantize "
                     "format"):
    checkpoint.load(TINY_CHECKPOINT, quantize_embedding=True)
  with pytest.raises(ValueError, match="already quantized"):
    quantize.quantize_params(qparams, qconfig)
  small_config = ModelConfig.tiny("llada")
  small = init_params(small_config, jax.random.key(0))
  with pytest.raises(ValueError, match=r"layers_0/attn_out/kernel has shape "
                     r"\(64, 64\) \[in, out\]: format int8-g128 needs its "
                     r"input size 64 divisible by 128"):
    quantize.quantize_params(small, small_config.replace(quantize="int8-g128"))
  checkpoint.save(tmp_path / "q", qparams, qconfig)
  with pytest.raises(ValueError, match=r"stored quantized as int8 with the "
                     r"embedding; it cannot be loaded as quantize='fp8' "):
    checkpoint.load(tmp_path / "q", quantize="fp8")
  with pytest.raises(ValueError, match=r"stored quantized as int8 with the "
                     r"embedding; it cannot be loaded as quantize='int8' "):
    checkpoint.load(tmp_path / "q", quantize="int8")
  checkpoint.save(tmp_path / "p", quantize.quantize_params(
      params, config.replace(quantize="int8")), config.replace(quantize="int8"))
  with pytest.raises(ValueError, match=r"stored quantized as int8; it cannot "
                     r"be loaded as quantize='int8', quantize_embedding=True "
                     r"\(leave"):
    checkpoint.load(tmp_path / "p", quantize="int8", quantize_embedding=True)
  with pytest.raises(ValueError, match="unknown quantization format"):
    checkpoint.load(TINY_CHECKPOINT, quantize="int4")
  with pytest.raises(ValueError, match="config says quantize='int8' but the "
                     "parameters hold unquantized kernels"):
    logits(params, np.zeros((1, 4), np.int32), config=qconfig)
  with pytest.raises(ValueError, match="hold 8-bit kernels but the config"):
    logits(qparams, np.zeros((1, 4), np.int32), config=config)
  with pytest.raises(ValueError, match="the config says quantize_embedding="
                     "False but the parameters hold 'embed' in 8 bits"):
    logits(qparams, np.zeros((1, 4), np.int32),
           config=qconfig.replace(quantize_embedding=False))
  src, _ = hf_fixtures.write_llada(tmp_path / "hf", n_layers=1)
  with pytest.raises(ConversionError, match="int8-g128 needs its input size"):
    convert_checkpoint(src, tmp_path / "g", quantize="int8-g128",
                       progress=False)
  assert not (tmp_path / "g").exists()


def test_old_config_without_the_fields_loads_as_bf16():
  config = checkpoint.load_config(TINY_CHECKPOINT)
  assert config.quantize is None and config.quantize_head is False
  assert config.quantize_embedding is False
