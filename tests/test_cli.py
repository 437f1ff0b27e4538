"""`python -m flash_dllm_jax generate`: strategies and their flags, prompt
sources, output formats, progress, the compilation cache and errors."""

import io
import json
import os
import re
import subprocess
import sys

import pytest

from flash_dllm_jax import cli, cli_io, compilation, generate, load
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests.paths import ROOT, TINY_CHECKPOINT

TINY = ["--checkpoint", str(TINY_CHECKPOINT)]
FLASH = ["--strategy", "flash-dllm", "--gen-length", "16", "--block-m", "8"]
LLADA = ["--gen-length", "8", "--steps", "4", "--block-length", "8"]


def run(capsys, *argv):
  code = cli.main(["generate", *argv])
  out = capsys.readouterr()
  return code, out.out, out.err


def test_flash_dllm_json_output(capsys):
  """--temperature / --top-k sample flash-dllm's rows as the API's
  `sampling` does (the same tokens); a prompt's seconds leave compiling
  out (compile_seconds)."""
  sampling = ["--temperature", "0.7", "--top-k", "5", "--seed", "3"]
  prompts = ["Hi", "Name a colour."]
  code, out, err = run(capsys, *TINY, *FLASH, *sampling, "--prompt", "Hi",
                       "--prompt", "Name a colour.", "--output", "json")
  assert code == 0, err
  doc = json.loads(out)
  assert doc["strategy"] == "flash-dllm" and doc["arch"] == "llada"
  assert [r["prompt"] for r in doc["results"]] == prompts
  api = generate(load(TINY_CHECKPOINT), prompts, seed=3, batch_size=32,
                 sampler=FlashDLLMSampler(gen_length=16, block_m=8,
                                          verify=True),
                 sampling=Sampling(temperature=0.7, top_k=5))
  assert doc["compile_seconds"] > 0
  for b, r in enumerate(doc["results"]):
    assert set(r) == {"prompt", "text", "token_ids", "steps", "forwards",
                      "tokens_per_step", "seconds"}
    assert r["text"] == api.texts[b]
    assert r["seconds"] <= doc["seconds"] - doc["compile_seconds"] + 0.01
    assert 1 <= r["steps"] <= r["forwards"] and r["seconds"] > 0
    assert len(r["token_ids"]) <= 16
    assert r["tokens_per_step"] == round(
        min(len(r["token_ids"]) + 1, 16) / r["steps"], 4)
  assert "strategy flash-dllm" in err


def test_attention_split_target_reaches_generate(capsys, monkeypatch):
  """--attention-split-target N: generate gets Kernels with that tiling
  (the flags' defaults: kernels=None)."""
  seen = []
  real = cli.generate

  def recording(*args, **kwargs):
    seen.append(kwargs["kernels"])
    return real(*args, **kwargs)

  monkeypatch.setattr(cli, "generate", recording)
  for extra in ([], ["--attention-split-target", "132"]):
    code, _, err = run(capsys, *TINY, *FLASH, "--prompt", "Hi", *extra)
    assert code == 0, err
  assert seen[0] is None
  assert seen[1].attention.split_target == 132 and seen[1].name is None


def test_prompt_file_text_jsonl_and_stdin(tmp_path, capsys, monkeypatch):
  lines = tmp_path / "p.txt"
  lines.write_text("First question\n\n  Second one\n")
  assert cli_io.read_prompts(["a"], lines) == ["a", "First question",
                                               "  Second one"]
  chat = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi"}]
  jsonl = tmp_path / "p.jsonl"
  jsonl.write_text(json.dumps({"prompt": "x"}) + "\n"
                   + json.dumps({"messages": chat, "id": 3}) + "\n")
  assert cli_io.read_prompts(None, jsonl) == ["x", chat]
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
      b"from stdin\n")))
  code, out, err = run(capsys, *TINY, *LLADA, "--prompt-file", str(jsonl),
                       "--output", "jsonl")
  assert code == 0, err
  rows = [json.loads(line) for line in out.splitlines()]
  assert [r["prompt"] for r in rows] == ["x", chat]
  code, out, err = run(capsys, *TINY, *LLADA)  # no flags: stdin
  assert code == 0, err
  assert out.startswith(">>> from stdin\n")


def test_progress_lines_for_several_calls(capsys):
  code, out, err = run(capsys, *TINY, *LLADA, "--batch-size", "1",
                       "--prompt", "a", "--prompt", "b", "--prompt", "c")
  assert code == 0, err
  assert [line.split(" prompts")[0] for line in err.splitlines()
          if "prompts," in line] == ["[1/3", "[2/3", "[3/3"]
  assert out.count(">>> ") == 3


@pytest.mark.parametrize("content,message", [
    (b"\n  \n", "has no prompts"),
    (b'{"prompt": "ok"}\n{"text": "no"}\n',
     "line 2: expected an object with a 'prompt' string or a 'messages'"),
    (b'{"prompt": "ok"}\n{not json\n', "line 2: not valid JSON"),
    (b'{"messages": [{"role": "user"}]}\n',
     "line 1, message 0: 'content' must be a string"),
    (b"fine\nbad \xff byte\n", r"line 2 is not valid UTF-8 \(invalid start "
                               r"byte at byte 9"),
])
def test_prompt_file_errors(tmp_path, capsys, content, message):
  path = tmp_path / "prompts.txt"
  path.write_bytes(content)
  code, _, err = run(capsys, *TINY, "--prompt-file", str(path))
  assert code == 1 and err.startswith("error: "), err
  assert len(err.strip().splitlines()) == 1
  assert str(path) in err
  assert re.search(message, err), err


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "dream", "--prompt", "x"],
     "strategy 'dream' decodes dream checkpoints, not 'llada'; strategies "
     "for 'llada': llada, threshold"),
    (["--strategy", "nope", "--prompt", "x"], "unknown strategy 'nope'"),
    (["--strategy", "llada", "--threshold", "0.5", "--prompt", "x"],
     "--threshold do not apply to strategy 'llada' (it takes: block_length, "
     "cfg_scale"),
    (["--stop", "first", "--prompt", "x"],
     "--stop is now --end-rule (Flash-dLLM's rule for where the answer ends)"),
    (["--topp", "0.5", "--prompt", "x"],
     "unknown option(s) --topp 0.5; strategy options: --gen-length"),
    (["--prompt", "ok", "--prompt", "caf\udcc3"],
     "--prompt #2 is not valid UTF-8: byte 0xc3 cannot be decoded at "
     "character 3 (near b'caf\\xc3')"),
    (["--prompt-file", "/nonexistent/p.txt"], "prompt file /nonexistent"),
    (["--attention-split-target", "0", "--prompt", "x"],
     "--attention-split-target: split_target must be an int >= 1, got 0"),
    (["--seed", "-1", "--prompt", "x"],
     "--seed must be an int in [0, 2**32), got -1"),
    (["--seed", str(2 ** 32), "--prompt", "x"],
     "--seed must be an int in [0, 2**32), got 4294967296"),
    (["--checkpoint", str(ROOT / "README.md"), "--prompt", "x"],
     f"checkpoint {ROOT / 'README.md'} is a file; a checkpoint is a "
     "directory"),
])
def test_clear_errors(capsys, argv, message):
  code, _, err = run(capsys, *TINY, *argv)
  assert code in (1, 2) and err.startswith("error: "), err
  assert message in err, err
  assert len(err.strip().splitlines()) == 1


def test_config_that_disagrees_with_the_tensors_is_one_error(capsys,
                                                             tmp_path):
  """A converted checkpoint whose config.json was edited: its stored shapes
  are checked when it loads, before any tensor is read."""
  import shutil
  ckpt = tmp_path / "ckpt"
  shutil.copytree(TINY_CHECKPOINT, ckpt)
  config = json.loads((ckpt / "config.json").read_text())
  (ckpt / "config.json").write_text(json.dumps(
      {**config, "mlp_hidden": 256, "n_layers": 1}))
  code, out, err = run(capsys, "--checkpoint", str(ckpt), "--prompt", "x")
  assert (code, out) == (1, "")
  [line] = err.strip().splitlines()
  assert line.startswith(f"error: checkpoint {ckpt}: its tensors do not "
                         "match its config.json (n_layers 1, ")
  assert "other shapes (3): layers_0/down_proj/kernel is 128x64 (config: " \
      "256x64)" in line
  assert "unexpected (9): layers_1/attn_norm/scale" in line


def test_missing_default_checkpoint_says_where(capsys, monkeypatch, tmp_path):
  monkeypatch.setenv(cli.CHECKPOINT_ENV, str(tmp_path / "gone"))
  code, _, err = run(capsys, "--prompt", "x")
  assert code == 1
  assert err.startswith(f"error: no checkpoint at {tmp_path / 'gone'}")
  assert "--checkpoint DIR or set FLASH_DLLM_JAX_CHECKPOINT" in err
  assert len(err.strip().splitlines()) == 1


def test_cache_dir_settings(monkeypatch, tmp_path):
  monkeypatch.setenv(compilation.CACHE_ENV, str(tmp_path / "c"))
  assert compilation.default_cache_dir() == tmp_path / "c"
  for off in ("off", "0", ""):
    monkeypatch.setenv(compilation.CACHE_ENV, off)
    assert compilation.default_cache_dir() is None
  monkeypatch.delenv(compilation.CACHE_ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compilation.default_cache_dir() == tmp_path / "flash-dllm-jax" / "jax"


def test_compile_log_tells_compiled_from_loaded():
  """JAX's events as it records them: a cache hit comes before the end of
  its backend-compile span, a fresh compile has none."""
  import jax
  with compilation.compile_log() as log:
    jax.monitoring.record_event_duration_secs(
        "/jax/core/compile/jaxpr_trace_duration", 0.5)
    jax.monitoring.record_event_duration_secs(
        "/jax/core/compile/backend_compile_duration", 2.0)
    jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
    jax.monitoring.record_event_duration_secs(
        "/jax/core/compile/backend_compile_duration", 0.25)
  assert (log.compiled, log.loaded) == (1, 1)
  assert log.describe(3.0) == ("3.00 s: 0.50 s tracing, 2.00 s compiling 1 "
                               "program, 0.25 s loading 1 program from the "
                               "compilation cache, 0.25 s decoding")


@pytest.mark.slow
def test_compile_cache_is_written_and_reused(tmp_path):
  """A first run fills the cache directory; a second run with the same
  command adds nothing (every executable came from the cache) and prints
  the same answer."""
  env = {**os.environ, compilation.CACHE_ENV: str(tmp_path / "cache")}
  cmd = [sys.executable, "-m", "flash_dllm_jax", "generate", *TINY, *LLADA,
         "--prompt", "Hi"]
  first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env=env)
  assert first.returncode == 0, first.stderr
  entries = sorted(os.listdir(tmp_path / "cache"))
  assert any(e.startswith("jit_decode_tokens") for e in entries), entries
  second = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env=env)
  assert second.returncode == 0, second.stderr
  assert second.stdout == first.stdout
  assert sorted(os.listdir(tmp_path / "cache")) == entries
  off = subprocess.run(cmd + ["--no-compile-cache"], capture_output=True,
                       text=True, cwd=ROOT, env={
                           **env, compilation.CACHE_ENV: str(tmp_path / "x")})
  assert off.returncode == 0 and not (tmp_path / "x").exists()
  # The last stderr line says what was compiled and what came from the cache.
  lines = [p.stderr.strip().splitlines()[-1] for p in (first, second, off)]
  n = r"(\d+) programs?"
  for line in (lines[0], lines[2]):
    assert re.search(rf"; [\d.]+ s: [\d.]+ s tracing, [\d.]+ s compiling {n}"
                     r", [\d.]+ s decoding\]$", line), line
  found = re.search(rf"; [\d.]+ s: [\d.]+ s tracing, [\d.]+ s loading {n} "
                    r"from the compilation cache, [\d.]+ s decoding\]$",
                    lines[1])
  assert found and "compiling" not in lines[1], lines[1]
  compiled = re.search(rf"compiling {n}", lines[0]).group(1)
  assert found.group(1) == compiled, lines


@pytest.mark.slow
def test_non_editable_install_names_the_missing_model(tmp_path):
  """`pip install .` copies no checkpoints: the default command then fails
  with one line naming where the model was expected and how to point at
  one, and --checkpoint works."""
  import shutil
  src = tmp_path / "src"  # a copy, so that no build files land in ROOT
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(ROOT / name, src / name)
  for name in ("flash_dllm_jax", "pallas_kernels"):
    shutil.copytree(ROOT / name, src / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  site = tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                  "--no-build-isolation", "--target", str(site), str(src)],
                 check=True, capture_output=True)
  env = {k: v for k, v in os.environ.items() if k != cli.CHECKPOINT_ENV}
  env["PYTHONPATH"] = str(site)
  cmd = [sys.executable, "-m", "flash_dllm_jax", "generate", "--prompt", "x",
         *LLADA]
  bare = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path,
                        env=env)
  assert bare.returncode == 1
  assert bare.stderr.startswith(f"error: no checkpoint at {site}")
  assert "pass --checkpoint DIR or set FLASH_DLLM_JAX_CHECKPOINT" in (
      bare.stderr)
  assert len(bare.stderr.strip().splitlines()) == 1
  pointed = subprocess.run(cmd + TINY, capture_output=True, text=True,
                           cwd=tmp_path, env=env)
  assert pointed.returncode == 0, pointed.stderr
  assert pointed.stdout.startswith(">>> x\n")


