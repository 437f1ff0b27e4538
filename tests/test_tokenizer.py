"""Tokenizer: tiny tokenizers, chat templates, Qwen2 vocab/merges, saving.

Oracles: transformers' slow Qwen2Tokenizer (its own regex/BPE in Python) for
the vocab.json + merges.txt path, and transformers' PreTrainedTokenizerFast /
apply_chat_template for saved directories and template rendering.
"""

import json
import unicodedata
from pathlib import Path

import jinja2
import pytest
import transformers

from flash_dllm_jax.architectures.dream.chat import (
    CHAT_TEMPLATE as DREAM_CHAT_TEMPLATE)
from flash_dllm_jax.architectures.llada.chat import (
    CHAT_TEMPLATE as LLADA_CHAT_TEMPLATE)
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.tokenizer import Tokenizer, build_tiny_tokenizer
from tests.hf_fixtures import write_qwen2_tokenizer_files

REFERENCE = Path("/work/shared/reference")
TEXTS = [
    "Hello world",
    "  leading spaces\n\nand newlines\r\n\tTabs   ",
    "numbers 12345 and 3.14159, 1,000,000",
    "I'm sure you're right; IT'S what we'LL see",
    "IT'Sthe DON'Tanswer WE'REthere they'VEmore",
    "café naïve 日本語 🙂 ünïcödé",
    "cafe\u0301 (decomposed, NFC-composed by the normaliser)",
    "<|im_start|>user\nhi<|im_end|>\n<|mask|><|mask|>",
    "def f(x):\n    return x ** 2  # square",
]
CONVERSATIONS = [
    [{"role": "user", "content": "  What is 2+2? \n"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Name a colour."}],
]


@pytest.fixture(scope="module", params=["llada", "dream"])
def tiny(request):
  return request.param, *build_tiny_tokenizer(request.param, 384)


def test_tiny_specials_are_top_ids_and_fit_a_config(tiny):
  arch, tok, ids = tiny
  assert tok.vocab_size == 384
  specials = {"llada": ["<|startoftext|>", "<|endoftext|>", "<|eot_id|>",
                        "<|start_header_id|>", "<|end_header_id|>",
                        "<|mdm_mask|>"],
              "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                        "<|beginoftext|>", "<|mask|>"]}[arch]
  assert [tok.token_to_id(t) for t in specials] == list(
      range(384 - len(specials), 384))
  eot = "<|eot_id|>" if arch == "llada" else "<|im_end|>"
  assert ids["eot_token_id"] == tok.eot_id == tok.token_to_id(eot)
  assert ids["mask_token_id"] == tok.mask_id == 383
  assert ids["eos_token_id"] == ids["pad_token_id"] == tok.token_to_id(
      "<|endoftext|>")
  bos = "<|startoftext|>" if arch == "llada" else "<|beginoftext|>"
  assert tok.bos_id == tok.token_to_id(bos)
  config = ModelConfig.tiny(arch, vocab_size=384, **ids)
  assert config.stop_token_ids == (ids["eos_token_id"], ids["eot_token_id"])


def test_tiny_is_deterministic_and_learned_merges(tiny):
  arch, tok, _ = tiny
  again, _ = build_tiny_tokenizer(arch, 384)
  assert again.backend.get_vocab() == tok.backend.get_vocab()
  assert len(tok.encode("the answer is")) < len("the answer is")


def test_encode_decode_round_trip(tiny):
  _, tok, _ = tiny
  for text in TEXTS[:6]:
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)
  ids = tok.encode("<|endoftext|>hi<|endoftext|>")
  assert ids[0] == ids[-1] == tok.eos_id  # special strings map to their ids
  assert tok.decode(ids) == "hi"
  assert tok.decode(ids, skip_special_tokens=False) == (
      "<|endoftext|>hi<|endoftext|>")
  assert tok.token_to_id("<|no such token|>") is None


def test_llada_template_renders_genuine_prompt():
  tok, _ = build_tiny_tokenizer("llada")
  prompt = tok.apply_chat_template([{"role": "user",
                                     "content": "  What is 2+2? \n"}])
  assert prompt == ("<|startoftext|><|start_header_id|>user<|end_header_id|>"
                    "\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant"
                    "<|end_header_id|>\n\n")


def test_dream_template_renders_qwen25_prompt():
  tok, _ = build_tiny_tokenizer("dream")
  messages = [{"role": "user", "content": "What is 2+2?"}]
  assert tok.apply_chat_template(messages) == (
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n")


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="no reference files")
def test_templates_are_the_genuine_ones():
  for name, template in [("llada-8b-instruct", LLADA_CHAT_TEMPLATE),
                         ("dream-v0-instruct-7b", DREAM_CHAT_TEMPLATE)]:
    genuine = json.loads((REFERENCE / name / "tokenizer_config.json"
                          ).read_text())["chat_template"]
    assert template == genuine


def test_saved_tokenizer_matches_transformers(tiny, tmp_path):
  _, tok, _ = tiny
  tok.save(tmp_path)
  loaded = Tokenizer.from_dir(tmp_path)
  fast = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
  for text in TEXTS:
    ids = tok.encode(text)
    assert loaded.encode(text) == ids
    assert fast.encode(text, add_special_tokens=False) == ids
    assert loaded.decode(ids) == fast.decode(ids, skip_special_tokens=True)
  for key in ("bos", "eos", "pad", "mask", "eot"):
    assert getattr(loaded, f"{key}_id") == getattr(tok, f"{key}_id")
  assert fast.bos_token_id == tok.bos_id and fast.eos_token_id == tok.eos_id
  tools = [{"type": "function", "function": {
      "name": "add", "description": "Adds numbers",
      "parameters": {"type": "object", "properties": {"a": {"type": "int"}}}}}]
  for messages in CONVERSATIONS:
    for gen in (True, False):
      assert loaded.apply_chat_template(messages, gen) == (
          fast.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=gen))
    assert loaded.apply_chat_template(messages, tools=tools) == (
        fast.apply_chat_template(messages, tools=tools, tokenize=False,
                                 add_generation_prompt=True))


def test_chat_template_file_wins_as_in_transformers(tmp_path):
  """A directory's chat_template.jinja (where SDAR-30B-A3B-Chat keeps its
  template) overrides tokenizer_config.json's, as transformers reads it."""
  tok, _ = build_tiny_tokenizer("llada", 384)
  tok.save(tmp_path)
  (tmp_path / "chat_template.jinja").write_text(
      "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
      "{% endfor %}")
  fast = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
  messages = CONVERSATIONS[1]
  want = fast.apply_chat_template(messages, tokenize=False)
  assert want.startswith("[system] Be brief.\n")
  assert Tokenizer.from_dir(tmp_path).apply_chat_template(messages) == want


def test_qwen2_vocab_merges_match_slow_tokenizer(tmp_path):
  tok, _ = build_tiny_tokenizer("dream")
  write_qwen2_tokenizer_files(tok, tmp_path)
  assert not (tmp_path / "tokenizer.json").exists()
  ours = Tokenizer.from_dir(tmp_path)
  slow = transformers.Qwen2Tokenizer.from_pretrained(tmp_path)
  assert ours.vocab_size == len(slow) == 384
  for text in TEXTS:
    nfc = unicodedata.normalize("NFC", text)
    pieces = [p for p, _ in ours.backend.pre_tokenizer.pre_tokenize_str(nfc)]
    assert pieces == ["".join(slow.byte_encoder[b] for b in piece.encode())
                      for piece in slow.pat.findall(nfc)]
    ids = ours.encode(text)
    assert ids == slow.encode(text, add_special_tokens=False), text
    assert ours.decode(ids, skip_special_tokens=False) == slow.decode(ids)
  assert [ours.eot_id, ours.mask_id, ours.eos_id, ours.bos_id] == (
      slow.convert_tokens_to_ids(["<|im_end|>", "<|mask|>", "<|endoftext|>",
                                  "<|beginoftext|>"]))


def test_qwen2_added_ids_must_follow_the_vocab(tmp_path):
  tok, _ = build_tiny_tokenizer("dream")
  write_qwen2_tokenizer_files(tok, tmp_path)
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  decoder = config["added_tokens_decoder"]
  decoder["500"] = decoder.pop("383")  # <|mask|> at an id after a gap
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  (tmp_path / "added_tokens.json").unlink()
  with pytest.raises(ValueError, match="should have id 500"):
    Tokenizer.from_dir(tmp_path)


def test_missing_files_and_template_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no tokenizer"):
    Tokenizer.from_dir(tmp_path)
  tok, _ = build_tiny_tokenizer("llada")
  bare = Tokenizer(tok.backend,
                   {"chat_template": "{{ raise_exception('no') }}"})
  with pytest.raises(jinja2.exceptions.TemplateError, match="no"):
    bare.apply_chat_template([{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match="no chat_template"):
    Tokenizer(tok.backend, {}).apply_chat_template([])
  assert Tokenizer(tok.backend, {}).bos_id is None
