"""convert_hf.py -> load -> generate, and the command line."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flash_dllm_jax
from flash_dllm_jax import cli
from flash_dllm_jax.generate import answer_ids
from tests import hf_fixtures

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_convert_load_generate(tmp_path, arch):
  write = hf_fixtures.write_llada if arch == "llada" else hf_fixtures.write_dream
  src, _ = write(tmp_path / "hf", seed=3)
  dst = tmp_path / "converted"
  subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_hf.py"),
                  str(src), str(dst), "--dtype", "float32"], check=True,
                 capture_output=True)
  model = flash_dllm_jax.load(dst)
  params, config, tokenizer = model
  assert config.arch == arch
  opts = (dict(gen_length=16, steps=8, block_length=8) if arch == "llada"
          else dict(gen_length=16, steps=8, alg="entropy"))
  out = flash_dllm_jax.generate(model, ["Name a colour.", "Count to three"],
                                chat=True, **opts)
  assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
  assert out.tokens_BxG.shape == (2, 16)
  assert not (out.tokens_BxG == config.mask_token_id).any()
  # The text is the decoded answer: it round-trips through the tokenizer.
  for row, text in zip(out.tokens_BxG, out.texts):
    ids = answer_ids(row, config)
    assert text == tokenizer.decode(ids)
  # Same prompts as token ids give the same tokens.
  rows = [tokenizer.encode(tokenizer.apply_chat_template(
      [{"role": "user", "content": p}])) for p in ["Name a colour.",
                                                 "Count to three"]]
  again = flash_dllm_jax.generate(model, rows, **opts)
  np.testing.assert_array_equal(again.tokens_BxG, out.tokens_BxG)


def test_cli_generates_with_the_default_checkpoint(capsys):
  assert cli.main(["generate", "--prompt", "What is 2 plus 3?",
                   "--gen-length", "16", "--steps", "8",
                   "--block-length", "8"]) == 0
  out = capsys.readouterr()
  assert ">>> What is 2 plus 3?" in out.out
  # A row stops once its answer is complete: at most steps = 8, one forward
  # each (the LLaDA sampler).
  report = re.search(r"\[llada, (\d+) steps, (\d+) forwards", out.err)
  assert report is not None, out.err
  assert 1 <= int(report[1]) <= 8 and report[1] == report[2]


def test_cli_reports_bad_input(tmp_path, capsys):
  assert cli.main(["generate", "--checkpoint", str(tmp_path / "missing"),
                   "--prompt", "x"]) == 1
  assert "error:" in capsys.readouterr().err
  assert cli.main(["generate", "--prompt", "x", "--gen-length", "10",
                   "--block-length", "4"]) == 1
  assert "multiple of block_length" in capsys.readouterr().err


def test_module_entry_point_runs():
  result = subprocess.run(
      [sys.executable, "-m", "flash_dllm_jax", "generate", "--prompt", "Hi",
       "--gen-length", "8", "--steps", "4", "--block-length", "8"],
      capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  assert ">>> Hi" in result.stdout
