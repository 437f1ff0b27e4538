"""HF -> orbax conversion: round trips against the oracle's tensors, the
load dtype, single-file sources and the tables against the genuine index
(the ways a source can be broken are in test_convert_failures.py)."""

import json
import shutil

import jax
import numpy as np
import pytest
import torch
from flax import traverse_util
from safetensors.torch import load_file, save_file

from flash_dllm_jax import checkpoint
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import convert_checkpoint
from flash_dllm_jax import architectures
from flash_dllm_jax.convert.tables import expected_names, resolve
from flash_dllm_jax.model import init_params
from flash_dllm_jax.tokenizer import Tokenizer, build_tiny_tokenizer
from tests import hf_fixtures
from tests.convert_case import REFERENCE
from tests.convert_case import llada_src, sources  # noqa: F401 (fixtures)


def expected_params(arch, oracle, dtype):
  """The oracle's tensors under our param paths, in our layout."""
  state = {(hf_fixtures.llada_name(n) if arch == "llada" else n): t
           for n, t in oracle.state_dict().items()}
  n_layers = oracle.config.num_hidden_layers
  out = {}
  for rule in architectures.get(arch).name_table():
    for layer in range(n_layers) if rule.per_layer else [None]:
      path = rule.param_path.format(layer=layer)
      tensor = state[rule.hf_name.format(layer=layer)].to(
          getattr(torch, dtype)).float().numpy()
      out[path] = tensor.T if tensor.ndim == 2 and path != "embed" else tensor
  return out


@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("src_dtype,dtype", [("float32", "float32"),
                                             ("bfloat16", "bfloat16"),
                                             ("float32", "bfloat16")])
def test_round_trip_equals_oracle(sources, tmp_path, capsys, arch, src_dtype,
                                  dtype):
  src, oracle = sources[arch, src_dtype]
  dst = tmp_path / "ckpt"
  written = convert_checkpoint(src, dst, dtype=dtype)
  assert "peak host memory" in capsys.readouterr().out
  params, config, tokenizer = checkpoint.load(dst)
  assert config == written and config.arch == arch and config.dtype == dtype

  # Same tree as the model's own init, with the oracle's values.
  init = traverse_util.flatten_dict(jax.eval_shape(
      lambda key: init_params(config, key), jax.random.key(0)), sep="/")
  flat = traverse_util.flatten_dict(params, sep="/")
  assert {p: a.shape for p, a in flat.items()} == {
      p: a.shape for p, a in init.items()}
  expected = expected_params(arch, oracle, src_dtype if dtype == "float32"
                             else "bfloat16")
  assert set(expected) == set(flat)
  for path, array in flat.items():
    assert array.dtype == np.dtype(dtype), path
    np.testing.assert_array_equal(np.asarray(array, np.float32),
                                  expected[path], err_msg=path)

  # Special ids from config.json, generation_config.json and the tokenizer.
  source_tok = Tokenizer.from_dir(src)
  assert config.eot_token_id == source_tok.eot_id is not None
  assert config.mask_token_id == source_tok.mask_id
  assert config.bos_token_id == (source_tok.bos_id if arch == "llada"
                                 else source_tok.eos_id)
  text = "Hello there, <|endoftext|> 3.14"
  assert tokenizer.encode(text) == source_tok.encode(text)
  messages = [{"role": "user", "content": "Hi"}]
  assert tokenizer.apply_chat_template(messages) == (
      source_tok.apply_chat_template(messages))

  on_disk = json.loads((dst / "config.json").read_text())
  assert on_disk["model_type"] == ("llada" if arch == "llada" else "Dream")
  manifest = json.loads((dst / "manifest.json").read_text())
  shards = json.loads((src / "model.safetensors.index.json").read_text())
  assert sorted(manifest["groups"]) == sorted(
      s.removesuffix(".safetensors")
      for s in set(shards["weight_map"].values()))
  for name in ("tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "generation_config.json"):
    assert (dst / name).is_file(), name
  assert not list(tmp_path.glob(".ckpt*"))  # no staging leftovers


def test_bounded_groups_and_load_dtype(sources, tmp_path):
  src, oracle = sources["dream", "float32"]
  convert_checkpoint(src, tmp_path / "c", dtype="bfloat16", progress=False,
                     max_group_bytes=40_000)
  groups = json.loads((tmp_path / "c" / "manifest.json").read_text())["groups"]
  assert len(groups) > 6 and all(".part" in g for g in groups)
  params, config, _ = checkpoint.load(tmp_path / "c", dtype="float32")
  assert config.dtype == "float32"
  flat = traverse_util.flatten_dict(params, sep="/")
  assert {a.dtype for a in flat.values()} == {np.dtype("float32")}
  expected = expected_params("dream", oracle, "bfloat16")
  for path, array in flat.items():
    np.testing.assert_array_equal(array, expected[path], err_msg=path)


def test_single_file_checkpoint(llada_src, tmp_path):
  tensors = {}
  for shard in sorted(llada_src.glob("model-*.safetensors")):
    tensors.update(load_file(shard))
    shard.unlink()
  (llada_src / "model.safetensors.index.json").unlink()
  save_file(tensors, str(llada_src / "model.safetensors"))
  convert_checkpoint(llada_src, tmp_path / "c", progress=False)
  params, _, _ = checkpoint.load(tmp_path / "c")
  assert json.loads((tmp_path / "c" / "manifest.json").read_text())[
      "groups"].keys() == {"model"}
  assert len(jax.tree.leaves(params)) == len(tensors)


def test_save_load_round_trip(tmp_path):
  tokenizer, ids = build_tiny_tokenizer("dream", 384)
  config = ModelConfig.tiny("dream", **ids).replace(dtype="bfloat16")
  params = init_params(config, jax.random.key(1))
  checkpoint.save(tmp_path / "c", params, config, tokenizer)
  loaded, loaded_config, loaded_tok = checkpoint.load(tmp_path / "c")
  assert loaded_config == config and loaded_tok.eot_id == ids["eot_token_id"]
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  with pytest.raises(FileExistsError):
    checkpoint.save(tmp_path / "c", params, config, tokenizer)
  shutil.rmtree(tmp_path / "c" / "params" / "layers_1")
  with pytest.raises(FileNotFoundError, match="params/layers_1"):
    checkpoint.load(tmp_path / "c")
  (tmp_path / "c" / "manifest.json").unlink()
  with pytest.raises(FileNotFoundError, match="manifest.json"):
    checkpoint.load(tmp_path / "c")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    checkpoint.load(tmp_path / "nowhere")


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="no reference files")
@pytest.mark.parametrize("name", ["llada-8b-instruct", "dream-v0-instruct-7b"])
def test_tables_cover_the_genuine_index(name):
  """The genuine 8B/7B tensor names map one-to-one onto our params."""
  config = ModelConfig.from_hf_config(REFERENCE / name / "config.json")
  index = json.loads((REFERENCE / name / "model.safetensors.index.json"
                      ).read_text())["weight_map"]
  table = config.spec.name_table()
  assert sorted(index) == sorted(expected_names(table, config))
  init = traverse_util.flatten_dict(jax.eval_shape(
      lambda key: init_params(config, key), jax.random.key(0)), sep="/")
  ours = {}
  for name in index:
    m = resolve(name, table, config)
    transposed = m.rule.transform == "transpose"
    ours[m.param_path] = m.expected_shape[::-1] if transposed else (
        m.expected_shape)
  assert ours == {path: a.shape for path, a in init.items()}
