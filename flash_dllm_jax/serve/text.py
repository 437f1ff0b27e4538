"""Which part of a row's answer is final, and the text it is safe to send.

A diffusion LLM fills positions in any order, but a sampler without token
editing never changes a committed token, so the left-to-right prefix of
committed tokens is final. A sampler that edits committed tokens (LLaDA2.1's
T2T edits) may change any generated token of its current block, so only
the blocks before it are final (`edit_block`). Text is sent only from the
final prefix, minus what could still change: a trailing incomplete UTF-8
sequence (decoded as U+FFFD) and a tail that could be the start of a stop
string.

A stop string cuts the answer as vLLM cuts it: the text ends before the
stop string; the ids (and with them the logprobs and
usage.completion_tokens) end with the token that completed it. While
streaming with stop strings, ids are sent only as far as the text sent
covers them, so the streamed ids equal the whole answer's.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import answer_ids


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


@dataclasses.dataclass(frozen=True, eq=False)
class AnswerText:
  """One request's answer as the slot's generation tokens make it: its
  rules (max_tokens, stop strings) and what was sent so far. `update`
  returns the next state; it never changes this one."""

  tokenizer: object
  config: ModelConfig
  max_tokens: int
  stop: Sequence[str] = ()
  edit_block: int | None = None  # an editing sampler's block length
  prompt_tokens: int = 0  # the prompt's length: it places the blocks
  sent: str = ""  # the text sent
  ids_sent: int = 0  # the answer ids sent
  revised: bool = False  # final text did not extend what was sent
  settled: int = -1  # generated tokens final at the last update

  def __post_init__(self):
    object.__setattr__(self, "stop", tuple(s for s in self.stop if s))

  def _with(self, **changes) -> "AnswerText":
    """dataclasses.replace without __init__ (a copy per update per row)."""
    new = object.__new__(type(self))
    new.__dict__.update(self.__dict__, **changes)
    return new

  def _decode(self, ids) -> str:
    return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

  def _stop_at(self, text: str) -> int | None:
    cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
    return min(cuts) if cuts else None

  def _first(self, ids: list[int], covered) -> int:
    """The least k in [0, len(ids)] with covered(decode(ids[:k])) (a
    predicate that stays true once true), by bisection."""
    lo, hi = 0, len(ids)
    while lo < hi:
      mid = (lo + hi) // 2
      if covered(self._decode(ids[:mid])):
        hi = mid
      else:
        lo = mid + 1
    return lo

  def _text(self, ids: list[int]) -> tuple[str, list[int], bool]:
    """(text, ids, stopped): a stop string cuts the text before it and the
    ids after the token that completed it."""
    text = self._decode(ids)
    cut = self._stop_at(text)
    if cut is None:
      return text, ids, False
    k = self._first(ids, lambda t: self._stop_at(t) is not None)
    return text[:cut], ids[:k], True

  def _covered(self, ids: list[int], sent: str) -> int:
    """How many of `ids` the text `sent` covers: all of them without stop
    strings (only a stop string cuts ids), else the most whose text fits."""
    longer = lambda t: len(t.rstrip("\ufffd")) > len(sent)
    if not self.stop or not longer(self._decode(ids)):
      return len(ids)
    return self._first(ids, longer) - 1

  def _settled(self, gen_G: np.ndarray, row_done: bool) -> int:
    """How many leading generated tokens can no longer change. An editing
    sampler's current block is the first with a mask, or, in its post-edit
    steps, the one before it; so, not knowing which, the blocks before the
    first masked one's predecessor are final (or all but the last block
    when no mask is left)."""
    masked = np.flatnonzero(gen_G == self.config.mask_token_id)
    first = int(masked[0]) if masked.size else len(gen_G)
    if self.edit_block is None or row_done:
      return first
    n, b = self.prompt_tokens, self.edit_block
    at = n + (first if masked.size else len(gen_G) - 1)
    end = at - at % b - (b if masked.size else 0)
    return min(max(end - n, 0), first)

  def update(self, gen_G: np.ndarray,
             row_done: bool) -> tuple[Progress, "AnswerText"]:
    """(what to send, the state after it). gen_G: the slot's generation
    region now; row_done: its loop stopped."""
    mask_id = self.config.mask_token_id
    if row_done:  # fill_after_stop's rule, on the host: no device op here
      gen_G = np.where(gen_G == mask_id, self.config.pad_token_id, gen_G)
    settled = self._settled(gen_G, row_done)
    if settled == self.settled and not row_done:  # the same final tokens
      return Progress("", False, None, None, []), self
    final_G = gen_G[:settled]
    ids = answer_ids(final_G, self.config)
    stop_token = len(ids) < len(final_G)  # a final stop token ends the answer
    done, reason = row_done or stop_token, "stop" if stop_token else "length"
    if len(ids) > self.max_tokens or (len(ids) == self.max_tokens
                                      and not stop_token):
      ids, done, reason = ids[:self.max_tokens], True, "length"
    text, ids, stopped = self._text(ids)
    if stopped:
      done, reason = True, "stop"
    if done:
      extends = text.startswith(self.sent)
      after = self._with(
          ids_sent=max(self.ids_sent, len(ids)),
          revised=self.revised or not extends,
          sent=text if extends else self.sent)
      return Progress(text[len(self.sent):] if extends else "", True, reason,
                      ids, ids[self.ids_sent:]), after
    hold = max((len(s) for s in self.stop), default=1) - 1
    safe = text[:len(text) - hold] if hold else text
    safe = safe.rstrip("\ufffd")
    if len(safe) > len(self.sent) and safe.startswith(self.sent):
      sent = safe
    else:
      sent = self.sent
    final = self._covered(ids, sent)
    after = self._with(ids_sent=max(self.ids_sent, final), sent=sent,
                       settled=settled)
    return Progress(sent[len(self.sent):], False, None, None,
                    ids[self.ids_sent:final]), after
