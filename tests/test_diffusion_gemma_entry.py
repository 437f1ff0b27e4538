"""DiffusionGemma through the entry points: a checkpoint directory with a
tokenizer loads with it (tests/diffusion_gemma_case.py), so text prompts,
the Gemma 4 chat template and the CLI work; continuous batching gives
every request its alone answer. All decodes share one sampler setting
(and so one compiled program per entry point)."""

import json

import numpy as np
import pytest

from flash_dllm_jax import checkpoint, cli
from flash_dllm_jax.generate import generate
from tests.diffusion_gemma_case import tiny_dir, tiny_tokenizer

SETTINGS = dict(canvas_length=4, max_denoising_steps=3, max_out_length=8)
FLAGS = ["--canvas-length", "4", "--max-denoising-steps", "3",
         "--max-out-length", "8"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return tiny_dir(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="module")
def model(ckpt):
  return checkpoint.load(ckpt, dtype="float32")


def test_the_tokenizer_loads_with_the_checkpoint(model):
  """Special tokens the files do not name come from the checkpoint's ids,
  the chat template is Gemma 4's, and the canvas noise is drawn from the
  tokenizer's ids."""
  _, config, tok = model
  assert (tok.bos_id, tok.eos_id, tok.eot_id) == (2, 1, 106)
  assert config.text_vocab_size == tok.vocab_size == 160
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"
  assert tok.encode(text)[:2] == [2, 105]
  assert tok.decode(tok.encode("Hi there, 42!")) == "Hi there, 42!"


def test_cli_generate_answers_a_text_prompt(model, ckpt, capsys):
  """`generate --checkpoint DIR --prompt TEXT` renders the chat template
  and prints the answer generate() gives for the same chat."""
  code = cli.main(["generate", "--checkpoint", str(ckpt), "--prompt", "Hi",
                   *FLAGS, "--seed", "3", "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err
  got = json.loads(out.out)["results"][0]
  want = generate(model, [{"role": "user", "content": "Hi"}], seed=3,
                  **SETTINGS)
  assert got["text"] == want.texts[0]
  ids = want.tokens_BxG[0].tolist()
  assert got["token_ids"] == ids[:len(got["token_ids"])]


def test_a_sentencepiece_only_directory_gets_one_clear_error(tmp_path):
  d = tiny_dir(tmp_path)
  (d / "tokenizer.json").unlink()
  (d / "tokenizer.model").write_bytes(b"\x00")
  with pytest.raises(ValueError, match="tokenizer.model but no "
                     "tokenizer.json"):
    checkpoint.load(d, dtype="float32")


def test_a_tokenizer_that_disagrees_with_the_checkpoint_is_refused(tmp_path):
  d = tiny_dir(tmp_path)
  tok = tiny_tokenizer()
  tok.config["bos_token"] = "<eos>"
  tok.save(d)
  with pytest.raises(ValueError, match="bos_token '<eos>' has id 1"):
    checkpoint.load(d, dtype="float32")
