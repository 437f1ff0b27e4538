"""A tiny DiffusionGemma checkpoint directory with a tokenizer: the tiny
official checkpoint (tests/reference/diffusion_gemma/tiny, 160 ids) plus a
character-level `tokenizer.json` whose special tokens sit at Gemma 4's ids
(pad 0, eos 1, bos 2, unk 3, mask 4, tool response 50, <|turn> 105,
<turn|> 106), spaces written as "▁" as Gemma's tokenizer does.
"""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers

from flash_dllm_jax.tokenizer import Tokenizer
from tests.paths import ROOT

TINY = ROOT / "tests" / "reference" / "diffusion_gemma" / "tiny"
VOCAB = 160
SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
            50: "<|tool_response>", 105: "<|turn>", 106: "<turn|>"}
# The tests' sampler settings (and as CLI flags). Sharp temperatures:
# canvases stop early on the default rule at different steps, answers end
# on an end token in different canvases or run out.
SETTINGS = dict(canvas_length=2, max_denoising_steps=8, entropy_bound=1e9,
                max_temperature=0.002, min_temperature=0.0005,
                max_out_length=6)
FLAGS = ["--canvas-length", "2", "--max-denoising-steps", "8",
         "--entropy-bound", "1e9", "--max-temperature", "0.002",
         "--min-temperature", "0.0005", "--max-out-length", "6"]
# Prompts (token ids, BOS first) of 2 to 12 tokens and their seeds.
PROMPTS = [[2, 17, 33, 5, 90, 121, 64, 8, 140, 77, 31, 12], [2, 99, 23, 57],
           [2, 61, 7, 150, 44, 44, 18, 101], [2, 9], [2, 30, 31, 32, 33, 34],
           [2, 88, 12, 140]]
SEEDS = [0, 7, 1, 2, 3, 4]
CHARS = ("▁\n" + string.ascii_lowercase + string.ascii_uppercase
         + string.digits + ".,!?:;'\"-+=*/()%")


def tiny_tokenizer() -> Tokenizer:
  """The 160-id character tokenizer (unused ids named <unusedN>); its
  tokenizer_config names no special tokens and no chat template, so the
  family's loader fills them in from the checkpoint."""
  chars = iter(CHARS)
  vocab = {}
  for i in range(VOCAB):
    token = SPECIALS.get(i) or next(chars, None) or f"<unused{i}>"
    vocab[token] = i
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[],
                                        unk_token="<unk>"))
  tok.normalizer = normalizers.Replace(" ", "▁")
  tok.decoder = decoders.Replace("▁", " ")
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in vocab if t.startswith("<")])
  assert tok.get_vocab_size(with_added_tokens=True) == VOCAB
  return Tokenizer(tok, {"clean_up_tokenization_spaces": False})


def tiny_dir(path: Path) -> Path:
  """`path` holding the tiny official checkpoint and the tokenizer."""
  path = Path(path)
  shutil.copytree(TINY, path, dirs_exist_ok=True)
  tiny_tokenizer().save(path)
  return path
