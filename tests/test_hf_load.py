"""Hugging Face directories load directly (load(hf_dir), --checkpoint
hf_dir): the same params as their converted copy, the converter's errors,
and a clear error for a directory that is neither kind."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util

import flash_dllm_jax
from flash_dllm_jax import architectures, checkpoint, cli
from flash_dllm_jax.convert import ConversionError, convert_checkpoint
from tests import hf_fixtures


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  return {"llada": hf_fixtures.write_llada(root / "llada", seed=5)[0],
          "dream": hf_fixtures.write_dream(root / "dream", seed=6)[0]}


def _flat(params):
  return traverse_util.flatten_dict(params, sep="/")


@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("dtype", [None, "float32"])
def test_hf_dir_loads_as_its_converted_copy(sources, tmp_path, arch, dtype):
  src = sources[arch]
  convert_checkpoint(src, tmp_path / "c", dtype=dtype or "bfloat16",
                     progress=False)
  want_params, want_config, want_tok = checkpoint.load(tmp_path / "c")
  params, config, tok = flash_dllm_jax.load(src, dtype=dtype)
  assert config == want_config
  assert checkpoint.load_config(src) == want_config.replace(dtype="bfloat16")
  got, want = _flat(params), _flat(want_params)
  assert sorted(got) == sorted(want)
  for path, array in want.items():
    assert isinstance(got[path], jax.Array)
    assert got[path].dtype == array.dtype, path
    np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(array))
  text = "Name a colour."
  assert tok.encode(text) == want_tok.encode(text)
  assert tok.apply_chat_template([{"role": "user", "content": text}]) == (
      want_tok.apply_chat_template([{"role": "user", "content": text}]))


def test_cli_decodes_an_hf_dir_like_its_converted_copy(sources, tmp_path,
                                                       capsys):
  convert_checkpoint(sources["llada"], tmp_path / "c", progress=False)
  argv = ["--prompt", "Hi", "--gen-length", "8", "--steps", "4",
          "--block-length", "8", "--output", "jsonl"]
  outs = []
  for ckpt in (sources["llada"], tmp_path / "c"):
    assert cli.main(["generate", "--checkpoint", str(ckpt), *argv]) == 0
    outs.append(json.loads(capsys.readouterr().out)["token_ids"])
  assert outs[0] == outs[1]


def test_broken_hf_dir_gets_the_converter_error(sources, tmp_path):
  src = shutil.copytree(sources["llada"], tmp_path / "src")
  index = json.loads((src / "model.safetensors.index.json").read_text())
  (src / sorted(set(index["weight_map"].values()))[0]).unlink()
  with pytest.raises(ConversionError, match="missing shard file"):
    flash_dllm_jax.load(src)
  config = json.loads((src / "config.json").read_text())
  (src / "config.json").write_text(json.dumps({**config,
                                               "model_type": "gpt_neox"}))
  with pytest.raises(ValueError, match="unknown model_type 'gpt_neox'"):
    flash_dllm_jax.load(src)


def test_directory_of_neither_kind(tmp_path, capsys):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="is neither a converted "
                     "checkpoint .* nor a Hugging Face directory of a family: "
                     + ", ".join(architectures.names())):
    flash_dllm_jax.load(tmp_path)
  assert cli.main(["generate", "--checkpoint", str(tmp_path), "--prompt",
                   "x"]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {tmp_path} is neither") and len(
      err.strip().splitlines()) == 1


def test_hf_dir_loads_onto_mesh_shards(sources):
  """On a model=2 mesh each weight arrives with its parallel.param_spec
  sharding and the values of the one-device load."""
  import os
  import subprocess
  import sys
  from tests.paths import ROOT
  script = (
      "import sys, numpy as np, jax\n"
      "from flax import traverse_util\n"
      "from flash_dllm_jax import load, parallel\n"
      "params, config, _ = load(sys.argv[1])\n"
      "one = traverse_util.flatten_dict(params, sep='/')\n"
      "mesh = parallel.parse_mesh('model=2')\n"
      "two = traverse_util.flatten_dict(load(sys.argv[1], mesh=mesh)[0], "
      "sep='/')\n"
      "for p, a in one.items():\n"
      "  want = parallel.param_spec(config, p, a.shape, mesh)\n"
      "  assert two[p].sharding.spec == want, (p, two[p].sharding, want)\n"
      "  np.testing.assert_array_equal(np.asarray(two[p]), np.asarray(a))\n"
      "print('MESH-OK')\n")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  result = subprocess.run([sys.executable, "-c", script,
                           str(sources["dream"])], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert "MESH-OK" in result.stdout, result.stderr[-3000:]
