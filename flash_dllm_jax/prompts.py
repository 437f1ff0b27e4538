"""Prompts in every accepted form -> token id rows -> padded batches.

A prompt is a string, a chat (a list of {"role", "content"} messages:
system / user / assistant, any number of turns), or token ids. A batch is a
list of such prompts. Chats, and strings when `chat` is on, are rendered with
the checkpoint's chat template exactly as transformers'
`apply_chat_template(messages, add_generation_prompt=True)` renders them.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

Message = dict[str, str]
# Prompts are left-padded to a multiple of this: fewer distinct shapes to
# compile, and padding in whole key tiles of the attention (its PAD_ALIGN),
# so that a row left-padded further by a multiple of it gets the same bits
# (the server's slot pool pads every prompt to its longest).
PROMPT_BUCKET = 64
PROMPT_FORMS = ("prompt must be a string, a list of chat messages ({'role', "
                "'content'} dicts), token ids, or a list of such prompts")


def has_chat_template(tokenizer) -> bool:
  """True when `tokenizer` carries a chat template (the default for `chat`)."""
  return tokenizer is not None and bool(tokenizer.config.get("chat_template"))


def resolve_chat(chat: bool | None, tokenizer) -> bool:
  """chat=None means: on exactly when the checkpoint has a chat template."""
  return has_chat_template(tokenizer) if chat is None else bool(chat)


def media_part(content) -> bool:
  """Whether chat content is a list of parts holding an image, audio or
  video part (OpenAI's image_url / input_audio, Gemma's image)."""
  return isinstance(content, (list, tuple)) and any(
      isinstance(p, dict) and str(p.get("type", "")).startswith(
          ("image", "input_image", "video", "audio", "input_audio"))
      for p in content)


def check_messages(messages: Sequence[Any], where: str = "prompt") -> list:
  """The messages as a list of dicts; a ValueError names the first bad one."""
  if not messages:
    raise ValueError(f"{where}: a chat needs at least one message")
  for i, m in enumerate(messages):
    if not isinstance(m, dict):
      raise ValueError(f"{where}, message {i}: expected a dict with 'role' "
                       f"and 'content', got {type(m).__name__}")
    if media_part(m.get("content")):
      raise ValueError(f"{where}, message {i} holds an image, audio or video "
                       "part: the models served here are text only (send "
                       "the text as a string)")
    for key in ("role", "content"):
      if not isinstance(m.get(key), str):
        raise ValueError(f"{where}, message {i}: {key!r} must be a string, "
                         f"got {m.get(key)!r}")
  return list(messages)


def _is_chat(x) -> bool:
  return isinstance(x, (list, tuple)) and bool(x) and all(
      isinstance(m, dict) for m in x)


def check_text(text: str, where: str) -> str:
  """`text` itself, or a ValueError if it is not encodable as UTF-8 (as
  command-line bytes that are not UTF-8 arrive: lone surrogates)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    bad = text[e.start]
    if 0xdc80 <= ord(bad) <= 0xdcff:  # an undecodable byte (surrogateescape)
      what = f"byte 0x{ord(bad) - 0xdc00:02x} cannot be decoded"
    else:
      what = f"{bad!r} is a lone surrogate"
    near = text[max(0, e.start - 20):e.end + 10]
    try:
      near = near.encode("utf-8", "surrogateescape")  # the original bytes
    except UnicodeEncodeError:
      near = near.encode("utf-8", "backslashreplace")
    raise ValueError(f"{where} is not valid UTF-8: {what} at character "
                     f"{e.start} (near {near!r})") from None
  return text


def split_prompts(prompt) -> list:
  """One prompt or a batch -> the list of single prompts (str, chat, ids)."""
  if isinstance(prompt, (np.ndarray, jax.Array)):
    arr = np.asarray(prompt)
    return [arr.tolist()] if arr.ndim == 1 else arr.tolist()
  if isinstance(prompt, str) or _is_chat(prompt):
    return [prompt]
  if not isinstance(prompt, (list, tuple)) or not prompt:
    raise TypeError(PROMPT_FORMS)
  if all(isinstance(x, (int, np.integer)) for x in prompt):
    return [list(prompt)]
  return list(prompt)


def render(prompt, tokenizer, chat: bool, index: int = 0) -> str:
  """The text of one string or chat prompt (chat template applied)."""
  where = f"prompt {index}"
  if isinstance(prompt, str):
    check_text(prompt, where)
    if not chat:
      return prompt
    prompt = [{"role": "user", "content": prompt}]
  messages = check_messages(prompt, where)
  for j, m in enumerate(messages):
    check_text(m["content"], f"{where}, message {j}")
  if not has_chat_template(tokenizer):
    raise ValueError(f"{where} is a chat, but this checkpoint's tokenizer "
                     "has no chat template")
  return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def token_rows(prompt, tokenizer, chat: bool | None) -> list[list[int]]:
  """Token id rows of a prompt or batch (see the module docstring)."""
  chat = resolve_chat(chat, tokenizer)
  rows = []
  for i, p in enumerate(split_prompts(prompt)):
    if isinstance(p, str) or _is_chat(p):
      if tokenizer is None:
        raise ValueError("text prompts need a tokenizer")
      rows.append(tokenizer.encode(render(p, tokenizer, chat, i)))
    elif isinstance(p, (list, tuple, np.ndarray)) and all(
        isinstance(t, (int, np.integer)) for t in p):
      rows.append([int(t) for t in p])
    else:
      raise TypeError(f"prompt {i}: {PROMPT_FORMS}")
  return rows


def padded_length(n: int, bucket: int = PROMPT_BUCKET,
                  room: int | None = None) -> int:
  """n rounded up to a multiple of bucket, but to no more than `room` (the
  positions the model leaves for a prompt) where n itself fits: padding
  never makes a fitting prompt fail."""
  p = -(-n // bucket) * bucket
  return p if room is None else max(n, min(p, room))


def left_pad(rows: Sequence[Sequence[int]], pad_id: int,
             bucket: int = PROMPT_BUCKET,
             room: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(ids_BxP int32, valid_BxP bool), P rounded up to a multiple of bucket
  (capped at room, see `padded_length`).

  Pads are masked keys and RoPE positions count from each row's first real
  token; the attention sums keys tile by tile, so extra left padding by a
  multiple of PROMPT_BUCKET leaves a row's result unchanged bit for bit
  (see `bucket_groups` for the exception).
  """
  if not rows or any(len(r) == 0 for r in rows):
    raise ValueError("every prompt needs at least one token")
  p = padded_length(max(len(r) for r in rows), bucket, room)
  ids = np.full((len(rows), p), pad_id, np.int32)
  valid = np.zeros((len(rows), p), bool)
  for b, row in enumerate(rows):
    ids[b, p - len(row):] = row
    valid[b, p - len(row):] = True
  return ids, valid


def bucket_groups(rows: Sequence[Sequence[int]], bucket: int = PROMPT_BUCKET,
                  room: int | None = None) -> list[np.ndarray]:
  """Row indices grouped by padded prompt length (each row's own length
  rounded up to `bucket`, capped at room), longest first.

  Each group decodes as its own batch, so a row's padding depends on the
  row alone. The project's attention (plain JAX and the Pallas kernel) gives
  the same bits under any whole-bucket padding, but the uncached forward's
  attention on GPUs, `jax.nn.dot_product_attention` (cuDNN for 16-bit
  inputs where JAX takes the shapes, else XLA's composition), makes no such
  promise, and shorter rows cost less compute in their own group.
  """
  padded = np.array([padded_length(len(r), bucket, room) for r in rows])
  return [np.flatnonzero(padded == p) for p in sorted(set(padded),
                                                       reverse=True)]
