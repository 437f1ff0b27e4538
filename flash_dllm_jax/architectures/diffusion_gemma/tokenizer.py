"""The tokenizer a DiffusionGemma checkpoint directory carries: Hugging
Face `tokenizer.json` (+ tokenizer_config.json), as the Hugging Face
release ships it, read by flash_dllm_jax.tokenizer.Tokenizer.

Special tokens and the chat template the files do not name come from the
checkpoint's special ids and Gemma 4's template (chat.py). The canvas
noise is drawn from the tokenizer's ids (the official Sampler passes
`tokenizer.vocab_size`) unless config.json sets "text_vocab_size".
"""

from __future__ import annotations

from pathlib import Path

from flash_dllm_jax.architectures.diffusion_gemma.chat import CHAT_TEMPLATE
from flash_dllm_jax.architectures.diffusion_gemma.config import GemmaConfig
from flash_dllm_jax.tokenizer import Tokenizer

_DEFAULT_SPECIALS = (("bos_token", "bos_token_id"),
                     ("eos_token", "eos_token_id"),
                     ("pad_token", "pad_token_id"),
                     ("eot_token", "end_of_turn_id"))


def load_tokenizer(ckpt_dir: Path, config: GemmaConfig
                   ) -> tuple[Tokenizer | None, GemmaConfig]:
  """(tokenizer or None when DIR has none, config with text_vocab_size
  from the tokenizer where the config sets none). ValueError when the files
  disagree with the checkpoint (more ids than embeddings, special ids)."""
  d = Path(ckpt_dir)
  if not (d / "tokenizer.json").is_file():
    if (d / "tokenizer.model").is_file():
      raise ValueError(
          f"{d} has Gemma's sentencepiece tokenizer.model but no "
          "tokenizer.json; add the Hugging Face tokenizer.json (the "
          "Hugging Face release ships one)")
    return None, config
  try:
    tok = Tokenizer.from_dir(d)
  except Exception as e:  # the Rust backend's parse errors are bare
    raise ValueError(f"{d}/tokenizer.json does not load: {e}") from None
  if tok.vocab_size > config.vocab_size:
    raise ValueError(f"{d}: the tokenizer has {tok.vocab_size} ids, more "
                     f"than the model's {config.vocab_size} embeddings")
  for key, field in _DEFAULT_SPECIALS:
    want = getattr(config, field)
    if tok.special_token(key) is None:
      tok.config[key] = tok.backend.id_to_token(want)
    elif key != "pad_token" and tok.token_to_id(tok.special_token(key)) != want:
      raise ValueError(
          f"{d}: the tokenizer's {key} {tok.special_token(key)!r} has id "
          f"{tok.token_to_id(tok.special_token(key))}, the checkpoint's "
          f"special tokens say {want}")
  tok.config.setdefault("chat_template", CHAT_TEMPLATE)
  if config.text_vocab_size is None:
    config = config.replace(text_vocab_size=tok.vocab_size)
  return tok, config
