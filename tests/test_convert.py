"""HF -> orbax conversion: round trips against the oracle's tensors, and one
test per way a source can be broken (DST must never be left behind)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from flax import traverse_util
from safetensors.torch import load_file, save_file

from flash_dllm_jax import checkpoint
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import ConversionError, convert_checkpoint
from flash_dllm_jax.convert.tables import TABLES, expected_names, resolve
from flash_dllm_jax.model import init_params
from flash_dllm_jax.tokenizer import Tokenizer, build_tiny_tokenizer
from tests import hf_fixtures

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path("/work/shared/reference")
WRITERS = {"llada": hf_fixtures.write_llada, "dream": hf_fixtures.write_dream}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """{(arch, dtype): (src dir, oracle)}, written once per module."""
  root = tmp_path_factory.mktemp("hf")
  return {(arch, dtype): write(root / f"{arch}-{dtype}", dtype=dtype)
          for arch, write in WRITERS.items()
          for dtype in ("float32", "bfloat16")}


@pytest.fixture
def llada_src(sources, tmp_path):
  """A private, editable copy of the float32 LLaDA source."""
  return Path(shutil.copytree(sources["llada", "float32"][0], tmp_path / "src"))


def expected_params(arch, oracle, dtype):
  """The oracle's tensors under our param paths, in our layout."""
  state = {(hf_fixtures.llada_name(n) if arch == "llada" else n): t
           for n, t in oracle.state_dict().items()}
  n_layers = oracle.config.num_hidden_layers
  out = {}
  for rule in TABLES[arch]:
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
  table = TABLES[config.arch]
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


# Broken sources ---------------------------------------------------------------
def edit_shards(src: Path, edit) -> None:
  """Applies edit(tensors) to every shard and rewrites the index to match."""
  weight_map = {}
  for shard in sorted(src.glob("model-*.safetensors")):
    tensors = load_file(shard)
    edit(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    weight_map.update({name: shard.name for name in tensors})
  index = json.loads((src / "model.safetensors.index.json").read_text())
  index["weight_map"] = dict(sorted(weight_map.items()))
  (src / "model.safetensors.index.json").write_text(json.dumps(index))


def rename(old, new):
  def edit(tensors):
    if old in tensors:
      tensors[new] = tensors.pop(old)
  return edit


def break_missing_shard(src):
  (src / "model-00002-of-00003.safetensors").unlink()
  return "missing shard file.*model-00002-of-00003.safetensors"


def break_truncated_shard(src):
  shard = src / "model-00003-of-00003.safetensors"
  shard.write_bytes(shard.read_bytes()[:-100])
  return "(?s)truncated or corrupt.*model-00003-of-00003.safetensors"


def break_corrupt_header(src):
  shard = src / "model-00001-of-00003.safetensors"
  data = bytearray(shard.read_bytes())
  data[8:12] = b"\xff\xfe\x00}"
  shard.write_bytes(bytes(data))
  return "(?s)truncated or corrupt.*model-00001-of-00003.safetensors"


def break_model_type(src):
  config = json.loads((src / "config.json").read_text())
  config["model_type"] = "gpt_neox"
  (src / "config.json").write_text(json.dumps(config))
  return "unknown model_type 'gpt_neox'"


def break_names(src):
  prefix = "model.transformer."
  edit_shards(src, rename(prefix + "blocks.1.up_proj.weight",
                          prefix + "blocks.1.upproj.weight"))
  edit_shards(src, rename(prefix + "blocks.0.q_proj.weight",
                          prefix + "blocks.7.q_proj.weight"))
  edit_shards(src, lambda t: t.pop(prefix + "ln_f.weight", None))
  return (r"(?s)unmapped tensors \(2\): model\.transformer\.blocks\.1\.upproj"
          r"\.weight, model\.transformer\.blocks\.7\.q_proj\.weight.*"
          r"missing tensors \(3\): model\.transformer\.blocks\.0\.q_proj"
          r"\.weight, model\.transformer\.blocks\.1\.up_proj\.weight, "
          r"model\.transformer\.ln_f\.weight")


def break_shapes(src):
  def edit(tensors):
    for name in ("model.transformer.blocks.0.k_proj.weight",
                 "model.transformer.wte.weight"):
      if name in tensors:
        tensors[name] = torch.zeros(tensors[name].shape[0] * 2,
                                    tensors[name].shape[1])
  edit_shards(src, edit)
  return (r"(?s)blocks\.0\.k_proj\.weight has shape \(64, 64\), expected "
          r"\(32, 64\).*wte\.weight has shape \(768, 64\), expected "
          r"\(384, 64\)")


BREAKERS = [break_missing_shard, break_truncated_shard, break_corrupt_header,
            break_model_type, break_names, break_shapes]


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__[6:])
def test_broken_source_leaves_no_dst(llada_src, tmp_path, breaker):
  message = breaker(llada_src)
  dst = tmp_path / "out" / "ckpt"
  with pytest.raises(ConversionError, match=message):
    convert_checkpoint(llada_src, dst, progress=False)
  assert not dst.exists()
  assert not (tmp_path / "out").exists() or not list(
      (tmp_path / "out").iterdir())


@pytest.mark.parametrize("breaker", [break_truncated_shard, break_names])
def test_failed_force_keeps_old_dst(llada_src, tmp_path, breaker):
  dst = tmp_path / "ckpt"
  dst.mkdir()
  (dst / "old.txt").write_text("old")
  with pytest.raises(ConversionError, match="already exists"):
    convert_checkpoint(llada_src, dst, progress=False)
  breaker(llada_src)
  with pytest.raises(ConversionError):
    convert_checkpoint(llada_src, dst, force=True, progress=False)
  assert [p.name for p in dst.iterdir()] == ["old.txt"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "src"]


def test_failure_while_writing_is_rolled_back(llada_src, tmp_path,
                                              monkeypatch):
  dst = tmp_path / "ckpt"
  dst.mkdir()
  (dst / "old.txt").write_text("old")

  def fail(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(checkpoint, "write_metadata", fail)
  with pytest.raises(ConversionError, match=r"cannot write .*ckpt: disk full"):
    convert_checkpoint(llada_src, dst, force=True, progress=False)
  assert [p.name for p in dst.iterdir()] == ["old.txt"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "src"]
  monkeypatch.undo()
  convert_checkpoint(llada_src, dst, force=True, progress=False)
  assert (dst / "manifest.json").is_file() and not (dst / "old.txt").exists()


def test_cli(llada_src, tmp_path):
  script = [sys.executable, str(REPO / "scripts" / "convert_hf.py")]
  ok = subprocess.run(script + [str(llada_src), str(tmp_path / "c"),
                                "--dtype", "float32"],
                      capture_output=True, text=True, cwd=REPO)
  assert ok.returncode == 0, ok.stderr
  assert "peak host memory" in ok.stdout
  assert checkpoint.load_config(tmp_path / "c").dtype == "float32"
  break_missing_shard(llada_src)
  bad = subprocess.run(script + [str(llada_src), str(tmp_path / "d")],
                       capture_output=True, text=True, cwd=REPO)
  assert bad.returncode == 1
  assert "error: missing shard file" in bad.stderr
  assert "Traceback" not in bad.stderr
  assert not (tmp_path / "d").exists()


@pytest.fixture
def tmpfs(tmp_path):
  """mount(name, options) -> a fresh tmpfs mounted at tmp_path/name (needs
  root or CAP_SYS_ADMIN), unmounted afterwards; None where mounting fails."""
  mounted = []

  def mount(name, options):
    path = tmp_path / name
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                        str(path)], capture_output=True, text=True)
    if r.returncode:
      return None, r.stderr.strip() or f"mount exited with {r.returncode}"
    mounted.append(path)
    return path, ""

  yield mount
  for path in mounted:
    subprocess.run(["umount", str(path)], check=True)


def _convert_cli(src, dst):
  script = [sys.executable, str(REPO / "scripts" / "convert_hf.py")]
  return subprocess.run(script + [str(src), str(dst), "--dtype", "float32"],
                        capture_output=True, text=True, cwd=REPO)


def _error_lines(stderr):
  """stderr without tqdm's progress lines."""
  return [l for l in stderr.splitlines()
          if l.strip() and not l.startswith("converting")]


def test_full_disk_is_one_line_and_leaves_nothing(llada_src, tmpfs):
  """A real full file system: a 256 KiB tmpfs for a ~640 KiB checkpoint."""
  fs, why = tmpfs("small", "size=256k")
  if fs is None:
    pytest.skip(f"cannot mount a small tmpfs to fill ({why})")
  result = _convert_cli(llada_src, fs / "ckpt")
  assert result.returncode == 1
  assert _error_lines(result.stderr) == [
      f"error: cannot write {fs / 'ckpt'}: No space left on device"]
  assert list(fs.iterdir()) == []
  # With --force over an old checkpoint: the old one stays as it was.
  (fs / "ckpt").mkdir()
  (fs / "ckpt" / "old.txt").write_text("old")
  with pytest.raises(ConversionError, match="No space left on device"):
    convert_checkpoint(llada_src, fs / "ckpt", force=True, progress=False)
  assert [p.name for p in fs.iterdir()] == ["ckpt"]
  assert [p.name for p in (fs / "ckpt").iterdir()] == ["old.txt"]


def test_read_only_destination_parent_is_one_line(llada_src, tmpfs, tmp_path):
  """A read-only file system (root ignores permission bits), else a
  directory without write permission."""
  parent, _ = tmpfs("ro", "ro,size=64k")
  if parent is None:
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o555)
  for dst in (parent / "ckpt", parent / "sub" / "ckpt"):
    result = _convert_cli(llada_src, dst)
    assert result.returncode == 1
    [line] = _error_lines(result.stderr)
    assert line in (f"error: cannot write {dst}: Read-only file system",
                    f"error: cannot write {dst}: Permission denied"), line
    assert list(parent.iterdir()) == []
