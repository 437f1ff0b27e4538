"""Text <-> token ids and chat prompts (each family's template and special
tokens come from its registry entry).

`Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (the fast Rust BPE) and
adds what lives in tokenizer_config.json: the special-token strings and the
jinja chat template, rendered the way `transformers` renders it.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

from flash_dllm_jax import architectures

# Qwen2's pre-tokenization regex (Dream ships only vocab.json + merges.txt).
QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                     r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                     r"\s+(?!\S)|\s+")
_FALLBACK_TOKENS = {"mask_token": ("<|mdm_mask|>", "<|mask|>"),
                    "eot_token": ("<|eot_id|>", "<|im_end|>", "<|role_end|>")}
_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "mask_token",
                 "unk_token", "cls_token")



def _content(token: Any) -> str | None:
  """A special token from a config: a plain string or an AddedToken dict."""
  return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict[str, Any]:
  return json.loads(path.read_text()) if path.exists() else {}


class Tokenizer:
  """A fast BPE tokenizer plus the special tokens and chat template of a model.

  `config` is the tokenizer_config.json dict (chat_template, bos_token, ...).
  """

  def __init__(self, tokenizer: tokenizers.Tokenizer,
               config: dict[str, Any] | None = None):
    self.backend = tokenizer
    self.config = dict(config or {})

  @classmethod
  def from_dir(cls, path: str | Path) -> "Tokenizer":
    """Reads tokenizer.json, or else vocab.json + merges.txt (Qwen2 style),
    plus tokenizer_config.json, special_tokens_map.json and
    chat_template.jinja (as in transformers, the file's template wins over
    the config's: SDAR-30B-A3B-Chat's is there only)."""
    path = Path(path)
    config = _read_json(path / "tokenizer_config.json")
    for key, value in _read_json(path / "special_tokens_map.json").items():
      config[key] = value  # as in transformers, the map wins
    if (path / "chat_template.jinja").exists():
      config["chat_template"] = (path / "chat_template.jinja").read_text(
          encoding="utf-8")
    if (path / "tokenizer.json").exists():
      backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    elif (path / "vocab.json").exists() and (path / "merges.txt").exists():
      backend = _qwen2_from_vocab_merges(path, config)
    else:
      raise FileNotFoundError(f"no tokenizer in {path}: expected "
                              "tokenizer.json or vocab.json + merges.txt")
    return cls(backend, config)

  # Text <-> ids ---------------------------------------------------------------
  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special-token strings in it map to their ids, and
    no BOS/EOS is added."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    return self.backend.decode([int(i) for i in ids],
                               skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  @property
  def vocab_size(self) -> int:
    """Number of ids including added tokens (may be < the embedding rows)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  # Special tokens -------------------------------------------------------------
  def special_token(self, key: str) -> str | None:
    """The string of `key` ('bos_token', 'mask_token', 'eot_token', ...): from
    the config, else the first known fallback string the vocabulary has."""
    token = _content(self.config.get(key))
    if token is None:
      token = next((t for t in _FALLBACK_TOKENS.get(key, ())
                    if self.token_to_id(t) is not None), None)
    return token

  def _special_id(self, key: str) -> int | None:
    token = self.special_token(key)
    return None if token is None else self.token_to_id(token)

  bos_id = property(lambda self: self._special_id("bos_token"))
  eos_id = property(lambda self: self._special_id("eos_token"))
  pad_id = property(lambda self: self._special_id("pad_token"))
  mask_id = property(lambda self: self._special_id("mask_token"))
  eot_id = property(lambda self: self._special_id("eot_token"),
                    doc="End of a chat turn: <|eot_id|> or <|im_end|>.")

  def special_ids(self) -> dict[str, int]:
    """{"bos_token_id": id, ...} of the BOS, EOS, pad and mask tokens the
    tokenizer names (for configs that lack them)."""
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "mask_token"):
      token_id = self._special_id(key)
      if token_id is not None:
        out[key + "_id"] = token_id
    return out

  # Chat -----------------------------------------------------------------------
  def apply_chat_template(self, messages: list[dict[str, Any]],
                          add_generation_prompt: bool = True,
                          **variables) -> str:
    """Renders `messages` ([{'role':..., 'content':...}]) to the prompt text."""
    template = self.config.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
      template = {t["name"]: t["template"] for t in template}.get("default")
    if not template:
      raise ValueError("this tokenizer has no chat_template")
    specials = {k: self.special_token(k) for k in _SPECIAL_KEYS}
    return _compile(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        **specials, **variables)

  # Saving ---------------------------------------------------------------------
  def save(self, path: str | Path) -> None:
    """Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json
    (loadable by this class and by transformers' PreTrainedTokenizerFast)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # Written from Python, so a failed write (a full disk) is an OSError;
    # the backend's own save reports one as a bare Exception.
    (path / "tokenizer.json").write_text(self.backend.to_str(pretty=True),
                                         encoding="utf-8")
    config = {k: v for k, v in self.config.items()
              if k not in ("auto_map", "vocab_file", "merges_file")}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
                 "normalized": t.normalized, "single_word": t.single_word,
                 "special": t.special}
        for i, t in sorted(self.backend.get_added_tokens_decoder().items())}
    special_map = {k: config[k] for k in _SPECIAL_KEYS + (
        "additional_special_tokens",) if config.get(k) is not None}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2))


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
  """Compiles a chat template with transformers' jinja environment."""

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
  return env.from_string(template)


def byte_level_pipeline(tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """Qwen2's byte-level BPE setup: NFC, regex split, byte-level mapping."""
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT_REGEX),
                           behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  return tok


def _qwen2_from_vocab_merges(path: Path,
                             config: dict[str, Any]) -> tokenizers.Tokenizer:
  """The fast equivalent of Qwen2Tokenizer(vocab.json, merges.txt) with the
  added tokens of tokenizer_config.json / added_tokens.json at their ids."""
  tok = byte_level_pipeline(tokenizers.Tokenizer(models.BPE.from_file(
      str(path / "vocab.json"), str(path / "merges.txt"))))
  added = {int(i): dict(t) for i, t in
           config.get("added_tokens_decoder", {}).items()}
  for content, i in _read_json(path / "added_tokens.json").items():
    added.setdefault(int(i), {"content": content, "special": True})
  for i, spec in sorted(added.items()):
    token = AddedToken(spec["content"],
                       single_word=spec.get("single_word", False),
                       lstrip=spec.get("lstrip", False),
                       rstrip=spec.get("rstrip", False),
                       normalized=spec.get("normalized", False),
                       special=spec.get("special", True))
    (tok.add_special_tokens if token.special else tok.add_tokens)([token])
    if tok.token_to_id(token.content) != i:
      raise ValueError(f"added token {token.content!r} should have id {i} but "
                       f"got {tok.token_to_id(token.content)}: ids in "
                       f"{path} are not contiguous after the BPE vocabulary")
  return tok


_TINY_CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
A language model reads text as a list of token ids and predicts missing ones.
Diffusion models start from a masked answer and reveal a few tokens per step.
Each step keeps the most confident predictions and masks the rest again.
What is 12 plus 30? The answer is 42, and 7 times 6 is also 42.
She said: "Please write a short poem about rivers, mountains and the sea."
In the morning we walked to the market, bought bread, apples and cheese.
def add(a, b):\n    return a + b\n\nprint(add(3, 4))  # prints 7
The weather today is sunny with a light wind from the west; tomorrow it rains.
Students should explain their reasoning step by step before giving the answer.
Question: Tom has 5 apples and gives 2 to Anna. How many apples does he have?
Answer: He has 5 - 2 = 3 apples left, so the final answer is 3.
It's a small world, isn't it? We'll see what they've done and what you're doing.
Numbers like 3.14159, 2024 and 1,000,000 appear in many documents.
The history of science is full of surprising ideas that later became obvious.
"""


def build_tiny_tokenizer(arch: str, vocab_size: int = 384,
                         ) -> tuple[Tokenizer, dict[str, int]]:
  """A small byte-level BPE trained on a built-in snippet, with `arch`'s
  genuine special tokens as the top ids and its genuine chat template.

  Returns the tokenizer (exactly `vocab_size` ids) and the special ids for a
  matching ModelConfig: mask/eos/pad/bos/eot_token_id, where bos_token_id
  follows the model config (Dream's is <|endoftext|>, as in its config.json).
  """
  spec = architectures.get(arch)
  specials = spec.tiny_special_tokens
  n_base = vocab_size - len(specials)
  if n_base < 256:
    raise ValueError(f"vocab_size must be >= {256 + len(specials)}, got "
                     f"{vocab_size}")
  tok = byte_level_pipeline(tokenizers.Tokenizer(models.BPE()))
  trainer = trainers.BpeTrainer(
      vocab_size=n_base, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_TINY_CORPUS.splitlines(keepends=True), trainer)
  filler = [f"<|reserved_token_{i}|>"
            for i in range(n_base - tok.get_vocab_size())]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in filler + list(specials)])
  config = dict(spec.tiny_tokenizer_config)
  config.update(clean_up_tokenization_spaces=False, model_max_length=4096)
  tokenizer = Tokenizer(tok, config)
  ids = dict(mask_token_id=tokenizer.mask_id, eos_token_id=tokenizer.eos_id,
             pad_token_id=tokenizer.pad_id, eot_token_id=tokenizer.eot_id,
             bos_token_id=(tokenizer.eos_id if spec.tiny_bos_is_eos
                           else tokenizer.bos_id))
  return tokenizer, ids
