"""HF -> orbax conversion of broken sources: one test per way a source can
be broken, a failed --force, a failure while writing, a full disk (also
while the tokenizer is written) and a read-only destination; DST is never
left behind, and the CLI says why in one line."""

import errno
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flash_dllm_jax import checkpoint, checkpoint_files
from flash_dllm_jax.convert import ConversionError, convert_checkpoint, \
    converter
from flash_dllm_jax.tokenizer import Tokenizer
from tests.convert_case import REPO
from tests.convert_case import llada_src, sources  # noqa: F401 (fixtures)


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
  monkeypatch.setattr(checkpoint_files, "write_metadata", fail)
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
  usage = subprocess.run(script + ["--help"], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "COLUMNS": "1000"})
  assert "the checkpoint is written quantized" in usage.stdout
  assert "as it loads" not in usage.stdout  # that is load's --quantize


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


def _failed_in(error: BaseException, function: str, file: str) -> bool:
  """Whether the write error behind `error` was raised inside `function`
  of `file` (the traceback of the exception it was converted from)."""
  cause = error.__context__
  frames = traceback.extract_tb(cause.__traceback__) if cause else []
  return any(f.name == function and f.filename.endswith(file) for f in frames)


def test_a_full_disk_under_the_tokenizer_is_an_os_error(tmp_path):
  """/dev/full as tokenizer.json (every write fails with ENOSPC, no root
  needed): the tokenizer's write is an OSError, which the converter turns
  into its one-line error."""
  if not Path("/dev/full").exists():
    pytest.skip("no /dev/full")
  (tmp_path / "tokenizer.json").symlink_to("/dev/full")
  tokenizer = Tokenizer.from_dir(REPO / "checkpoints" / "tiny-random-llada")
  with pytest.raises(OSError) as err:
    tokenizer.save(tmp_path)
  assert err.value.errno == errno.ENOSPC
  dst = tmp_path / "ckpt"
  with pytest.raises(ConversionError, match=f"^cannot write {dst}: No space "
                     "left on device$"):
    with converter._write_errors(dst):
      tokenizer.save(tmp_path)


def test_a_disk_filling_at_any_point_is_one_error(llada_src, tmpfs):
  """Real tmpfs file systems from a little less than the checkpoint needs
  to a little more, in 4 KiB steps: each conversion succeeds or fails with
  the one error and nothing left; some fill while the tokenizer is
  written."""
  roomy, why = tmpfs("roomy", "size=8m")
  if roomy is None:
    pytest.skip(f"cannot mount a tmpfs to fill ({why})")
  convert_checkpoint(llada_src, roomy / "ckpt", dtype="float32",
                     progress=False)
  st = os.statvfs(roomy)
  used_kb = (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
  at_tokenizer = []
  for kb in range(used_kb - 96, used_kb + 24, 4):
    fs, _ = tmpfs(f"fs{kb}", f"size={kb}k")
    try:
      convert_checkpoint(llada_src, fs / "ckpt", dtype="float32",
                         progress=False)
    except ConversionError as e:
      assert str(e) == (f"cannot write {fs / 'ckpt'}: No space left on "
                        "device")
      assert list(fs.iterdir()) == []
      if _failed_in(e, "save", "tokenizer.py"):
        at_tokenizer.append(kb)
    else:
      assert [p.name for p in fs.iterdir()] == ["ckpt"]
  assert at_tokenizer, f"no size filled the disk at the tokenizer ({used_kb}"\
      " KiB used)"
  # The command line at such a size: one line.
  fs, _ = tmpfs("cli", f"size={at_tokenizer[0]}k")
  result = _convert_cli(llada_src, fs / "ckpt")
  assert result.returncode == 1
  assert _error_lines(result.stderr) == [
      f"error: cannot write {fs / 'ckpt'}: No space left on device"]
  assert list(fs.iterdir()) == []
