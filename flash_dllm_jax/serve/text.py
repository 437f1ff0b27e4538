"""Which part of a row's answer is final, and the text it is safe to send.

A diffusion LLM fills positions in any order, but LLaDA/Dream-style samplers
never change a committed token, so the left-to-right prefix of committed
tokens is final. Text is sent only from that prefix, minus what could still
change: a trailing incomplete UTF-8 sequence (decoded as U+FFFD) and a tail
that could be the start of a stop string.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.sampling.state import fill_after_stop


class Progress(NamedTuple):
  """delta: new text to send; done: the answer is complete; reason: 'stop'
  (stop token or string) or 'length' (max_tokens or gen_length);
  token_ids: the answer's ids once done; new_ids: answer ids that became
  final since the last update."""

  delta: str
  done: bool
  reason: str | None
  token_ids: list[int] | None
  new_ids: list[int] = []


class AnswerText:
  """Tracks one request's answer from the slot's generation tokens."""

  def __init__(self, tokenizer, config: ModelConfig, max_tokens: int,
               stop: Sequence[str] = ()):
    self.tokenizer, self.config = tokenizer, config
    self.max_tokens, self.stop = max_tokens, tuple(s for s in stop if s)
    self.sent = ""
    self.ids_sent = 0
    self.revised = False  # set if final text did not extend what was sent

  def _text(self, ids: list[int]) -> tuple[str, bool]:
    text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
    cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
    if cuts:
      return text[:min(cuts)], True
    return text, False

  def update(self, gen_G: np.ndarray, row_done: bool) -> Progress:
    """gen_G: the slot's generation region now; row_done: its loop stopped."""
    mask_id = self.config.mask_token_id
    if row_done:
      gen_G = np.asarray(fill_after_stop(gen_G, mask_id,
                                         self.config.pad_token_id))
    masked = np.flatnonzero(gen_G == mask_id)
    final_G = gen_G[:masked[0]] if masked.size else gen_G
    ids = answer_ids(final_G, self.config)
    stop_token = len(ids) < len(final_G)  # a final stop token ends the answer
    done, reason = row_done or stop_token, "stop" if stop_token else "length"
    if len(ids) > self.max_tokens or (len(ids) == self.max_tokens
                                      and not stop_token):
      ids, done, reason = ids[:self.max_tokens], True, "length"
    new_ids, self.ids_sent = ids[self.ids_sent:], max(self.ids_sent, len(ids))
    text, stopped = self._text(ids)
    if stopped:
      done, reason = True, "stop"
    if done:
      if not text.startswith(self.sent):
        self.revised = True
      delta = text[len(self.sent):] if text.startswith(self.sent) else ""
      self.sent = text if text.startswith(self.sent) else self.sent
      return Progress(delta, True, reason, ids, new_ids)
    hold = max((len(s) for s in self.stop), default=1) - 1
    safe = text[:len(text) - hold] if hold else text
    safe = safe.rstrip("\ufffd")
    if len(safe) > len(self.sent) and safe.startswith(self.sent):
      delta, self.sent = safe[len(self.sent):], safe
      return Progress(delta, False, None, None, new_ids)
    return Progress("", False, None, None, new_ids)
