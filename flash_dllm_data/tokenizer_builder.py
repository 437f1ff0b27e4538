"""The project's small tokenizer: byte-level BPE trained on the synthetic
corpus.

Qwen2-style pipeline (NFC, the Qwen2 split regex, byte-level BPE), whose
regex splits every digit into its own token so the model sees numbers digit
by digit, which makes arithmetic learnable. The architecture's special tokens
take the top ids and its chat template is attached (LLaDA's by default, or
LLaDA2's), so a checkpoint with this tokenizer is a model of that
architecture to the rest of the project.
"""

from __future__ import annotations

import json
from typing import Iterable, Sequence

import tokenizers
from tokenizers import AddedToken, models
from tokenizers import pre_tokenizers, trainers

from flash_dllm_jax import architectures
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    ARCH as GEMMA_ARCH, GEMMA4_SPECIAL)
from flash_dllm_jax.architectures.llada.chat import CHAT_TEMPLATE as LLADA_CHAT_TEMPLATE
from flash_dllm_jax.tokenizer import Tokenizer, byte_level_pipeline

SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>", "<|eot_id|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|mdm_mask|>")
DEFAULT_VOCAB_SIZE = 1024
# Text the chat template and the eval prompts add around the problems.
_EXTRA_TEXT = ("user\n\nassistant\n\n", "Question: ", "\nAnswer:",
               "Answer: ", "The answer is ")
# LLaDA2's template adds these (merged only in its tokenizer, so LLaDA's
# stays what it was).
_LLADA2_TEXT = ("SYSTEM", "detailed thinking off", "HUMAN", "ASSISTANT")
# Text Gemma 4's chat template adds (merged only in its tokenizer).
_GEMMA_TEXT = ("user\n", "model\n")
# DiffusionGemma's special tokens (Gemma 4's strings), by GEMMA4_SPECIAL key.
GEMMA_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>",
                "unk": "<unk>", "mask": "<mask>",
                "begin_of_tool_response": "<|tool_response>",
                "start_of_turn": "<|turn>", "end_of_turn": "<turn|>"}


def corpus_texts(problems: Sequence[dict]) -> list[str]:
  """The training text of GSM-format problems: questions and answers."""
  texts = []
  for row in problems:
    texts.append(row["question"])
    texts.append(row["answer"])
  return texts


def build_tokenizer(texts: Iterable[str],
                    vocab_size: int = DEFAULT_VOCAB_SIZE,
                    arch: str = "llada",
                    ) -> tuple[Tokenizer, dict[str, int]]:
  """Trains the BPE on `texts` and returns (Tokenizer with exactly
  `vocab_size` ids, special ids for ModelConfig(arch=arch, ...)).
  arch: 'llada' (LLaDA's specials and template) or any architecture with
  tiny-tokenizer specials (llada2: <|mask|>, <|role_end|>, roles).

  Unused ids below the specials are reserved tokens, so the vocabulary size
  (the embedding rows) is fixed whatever the corpus. Deterministic given
  the texts and vocab_size.
  """
  if arch == GEMMA_ARCH:
    return _gemma_tokenizer(texts, vocab_size)
  if arch == "llada":
    specials, config = SPECIAL_TOKENS, dict(
        add_bos_token=False, add_eos_token=False,
        bos_token="<|startoftext|>", eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", mask_token="<|mdm_mask|>",
        chat_template=LLADA_CHAT_TEMPLATE)
    extra = _EXTRA_TEXT
  else:
    spec = architectures.get(arch)
    specials, config = spec.tiny_special_tokens, dict(
        spec.tiny_tokenizer_config)
    extra = _EXTRA_TEXT + (_LLADA2_TEXT if arch == "llada2" else ())
  n_base = vocab_size - len(specials)
  tok = _train_bpe(list(texts) + list(extra), n_base, len(specials))
  filler = [f"<|reserved_token_{i}|>"
            for i in range(n_base - tok.get_vocab_size())]
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in filler + list(specials)])
  config.update(clean_up_tokenization_spaces=False, model_max_length=4096)
  tokenizer = Tokenizer(tok, config)
  if tokenizer.vocab_size != vocab_size:
    raise RuntimeError(f"built {tokenizer.vocab_size} ids, wanted {vocab_size}")
  return tokenizer, special_ids(tokenizer)


def _train_bpe(texts: list[str], n_base: int, n_specials: int
               ) -> tokenizers.Tokenizer:
  """The byte-level BPE of at most n_base ids trained on `texts`."""
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if n_base < len(alphabet):
    minimum = len(alphabet) + n_specials
    raise ValueError(f"vocab_size must be >= {minimum} (256 bytes + "
                     f"{n_specials} specials), got {n_base + n_specials}")
  if not any(texts):
    raise ValueError("build_tokenizer needs some non-empty training text")
  tok = byte_level_pipeline(tokenizers.Tokenizer(models.BPE()))
  trainer = trainers.BpeTrainer(vocab_size=n_base, show_progress=False,
                                initial_alphabet=alphabet)
  tok.train_from_iterator(texts, trainer)
  return tok


def _gemma_tokenizer(texts: Iterable[str], vocab_size: int
                     ) -> tuple[Tokenizer, dict[str, int]]:
  """build_tokenizer's BPE with DiffusionGemma's special tokens at Gemma
  4's ids (pad 0, EOS 1, BOS 2, <unk> 3, <mask> 4, <|tool_response> 50,
  <|turn> 105, <turn|> 106: the ids a DiffusionGemma config names; PAD 0
  is what its sampler writes after an end token); the learned tokens, then
  reserved ones, fill the other ids in order. Gemma 4's chat template."""
  specials = {GEMMA4_SPECIAL[k]: t for k, t in GEMMA_TOKENS.items()}
  if vocab_size <= max(specials):
    raise ValueError(f"vocab_size must be > {max(specials)} (Gemma 4's "
                     f"special ids), got {vocab_size}")
  learned = _train_bpe(list(texts) + list(_EXTRA_TEXT) + list(_GEMMA_TEXT),
                       vocab_size - len(specials), len(specials))
  model = json.loads(learned.to_str())["model"]
  merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            for m in model["merges"]]
  order = sorted(model["vocab"], key=model["vocab"].get)
  free = [i for i in range(vocab_size) if i not in specials]
  reserved = [f"<|reserved_token_{i}|>" for i in range(len(free) - len(order))]
  vocab = dict(zip(order + reserved, free))
  vocab.update({t: i for i, t in specials.items()})
  tok = byte_level_pipeline(tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=merges)))
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in reserved + [specials[i]
                                               for i in sorted(specials)]])
  config = dict(architectures.get(GEMMA_ARCH).tiny_tokenizer_config,
                mask_token=GEMMA_TOKENS["mask"], unk_token=GEMMA_TOKENS["unk"],
                eot_token=GEMMA_TOKENS["end_of_turn"],
                clean_up_tokenization_spaces=False, model_max_length=4096)
  tokenizer = Tokenizer(tok, config)
  if tokenizer.vocab_size != vocab_size:
    raise RuntimeError(f"built {tokenizer.vocab_size} ids, wanted {vocab_size}")
  return tokenizer, special_ids(tokenizer)


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
  """mask/eos/pad/bos/eot_token_id of the tokenizer, checked."""
  ids = dict(mask_token_id=tokenizer.mask_id, eos_token_id=tokenizer.eos_id,
             pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.bos_id,
             eot_token_id=tokenizer.eot_id)
  missing = sorted(k for k, v in ids.items() if v is None)
  if missing:
    raise ValueError(f"tokenizer lacks special tokens for {missing}")
  return ids
