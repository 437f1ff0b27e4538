"""Fresh training rows drawn while training runs: no draw served twice.

`StreamBatches(...)(step)` is the batch of step s: problems s*B .. s*B+B-1
of the synthetic train stream (`synthetic_gsm.draw('train', data_seed, i)`,
worded per `phrasing`),
tokenized into rows exactly as `data.encode_problems` makes them (user turn
alternating by the problem's index i), with the EOS padding `data.Batches`
draws for that step. A problem whose question is held out (`exclude`: the
test questions) or whose row would not fit seq_len is replaced by its next
`attempt` draw, so batch s depends only on (data_seed, phrasing, s, batch
size, seq_len, tokenizer, exclude, seed): a resumed run sees the batches it
would have seen, and no training row ever holds a held-out question. Distinct
draws can still share a question (about 90% of the questions in a million
draws are distinct; templates with small number ranges repeat more).

Rows are tokenized by `RowEncoder`, which reproduces the tokenizer's ids from cached pieces and
is checked against it on the first row of every batch. workers > 0 draw
batches ahead in that many spawned processes (one batch a task, `prefetch`
steps ahead); workers=0 draws in the calling process.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import re
from typing import Iterable

import numpy as np

from flash_dllm_data import synthetic_gsm
from flash_dllm_data.phrasing import check_phrasing
from flash_dllm_jax.tokenizer import Tokenizer
from flash_dllm_train.data import (EOS_PAD, EncodedRows, pad_lengths,
                                          rows_batch, user_text)

_DIGIT = re.compile(r"([0-9])")
_SENTINEL = "\x00CONTENT\x00"
_PROBES = ("1234", "a 12 b34c 5.6 $7, x\n8 9\n\n10  11\t12 ", "'s1'd2",
           "<<3*4=12>>12 apples.\n#### 12", "1,080 1st 2nd -3 +4")


class RowEncoder:
  """`encode_problems`' ids for one problem at a time, fast.

  The tokenizers this project builds (and Qwen2's) split every digit into
  its own pre-token, so text is encoded piece by piece between digits: the
  ids of a piece followed by a digit are those of piece + "0" without the
  last id (what follows decides a trailing-whitespace split), of the last
  piece those of the piece alone; pieces come from a dict cache (templated
  text repeats). The chat prompt is the template rendered once around a
  sentinel. `check` compares a row with the tokenizer's own encoding."""

  def __init__(self, tokenizer: Tokenizer):
    eos, eot = tokenizer.eos_id, tokenizer.eot_id
    if eos is None or eot is None or tokenizer.mask_id is None:
      raise ValueError("the tokenizer needs EOS, <|eot_id|> and mask tokens")
    self.tokenizer, self.eos, self.eot = tokenizer, eos, eot
    self._backend = tokenizer.backend
    digits = [self._hf(d) for d in "0123456789"]
    if any(len(ids) != 1 for ids in digits):
      raise ValueError("RowEncoder needs a tokenizer that splits digits")
    self._digit = {str(d): ids[0] for d, ids in enumerate(digits)}
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True)
    if prompt.count(_SENTINEL) != 1:
      raise ValueError("the chat template does not show the user turn once")
    self._before, self._after = prompt.split(_SENTINEL)
    self._mid: dict[str, list[int]] = {}
    self._end: dict[str, list[int]] = {}
    for probe in _PROBES:
      if self.encode(probe) != self._hf(probe):
        raise ValueError(f"RowEncoder needs a tokenizer that splits digits "
                         f"off as pre-tokens (differs on {probe!r})")
    self._mid.clear()
    self._end.clear()

  def _hf(self, text: str) -> list[int]:
    return self._backend.encode(text, add_special_tokens=False).ids

  def prompt_text(self, question: str, index: int) -> str:
    # The template trims the content (jinja's trim is str.strip).
    return self._before + user_text(question, index).strip() + self._after

  def encode(self, text: str) -> list[int]:
    """The tokenizer's ids of `text` (no special tokens added)."""
    parts = _DIGIT.split(text)
    ids: list[int] = []
    last = len(parts) - 1
    for k, part in enumerate(parts):
      if k % 2:
        ids.append(self._digit[part])
      elif part:
        cache = self._end if k == last else self._mid
        got = cache.get(part)
        if got is None:
          if k == last:
            got = self._hf(part)
          else:
            got = self._hf(part + "0")
            if got[-1] != self._digit["0"]:
              raise RuntimeError(f"digit not split off after {part!r}")
            got = got[:-1]
          cache[part] = got
        ids += got
    return ids

  def row(self, problem: dict, index: int) -> tuple[list[int], int]:
    """(prompt ids + answer ids + <|eot_id|>, prompt length) of a problem;
    the training row is these ids, then EOS to the sequence length."""
    prompt = self.encode(self.prompt_text(problem["question"], index))
    return prompt + self.encode(problem["answer"]) + [self.eot], len(prompt)

  def check(self, problem: dict, index: int) -> None:
    """Raises unless `row` equals the chat template + tokenizer's ids."""
    text = self.tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text(problem["question"], index)}],
        add_generation_prompt=True)
    prompt = self._hf(text)
    want = prompt + self._hf(problem["answer"]) + [self.eot]
    if self.row(problem, index) != (want, len(prompt)):
      raise RuntimeError(f"RowEncoder differs from the tokenizer on problem "
                         f"{index}: {problem['question']!r}")


class _RowMaker:
  """The rows of one batch (see the module docstring)."""

  def __init__(self, tokenizer: Tokenizer, seq_len: int, batch_size: int,
               data_seed: int, exclude: frozenset[str], phrasing: str):
    self.encoder = RowEncoder(tokenizer)
    self.seq_len, self.batch_size = seq_len, batch_size
    self.data_seed, self.exclude = data_seed, exclude
    self.phrasing = phrasing

  def rows(self, step: int) -> tuple[EncodedRows, int, int]:
    """(rows of batch `step`, held-out draws replaced, long rows replaced)."""
    n, b = self.seq_len, self.batch_size
    tokens = np.full((b, n), self.encoder.eos, np.int32)
    prompt_len, min_len = np.empty(b, np.int32), np.empty(b, np.int32)
    held = long = 0
    for j in range(b):
      index = step * b + j
      for attempt in range(1000):
        problem = synthetic_gsm.draw("train", self.data_seed, index, attempt,
                                     self.phrasing)
        if problem["question"] in self.exclude:
          held += 1
          continue
        if j == 0 and attempt == 0:
          self.encoder.check(problem, index)
        ids, p = self.encoder.row(problem, index)
        if len(ids) + 1 > n:  # keep at least one EOS after <|eot_id|>
          long += 1
          continue
        break
      else:
        raise RuntimeError(f"no problem at index {index} fits seq_len {n}")
      tokens[j, :len(ids)] = ids
      prompt_len[j], min_len[j] = p, len(ids) + 1
    return EncodedRows(tokens, prompt_len, min_len, 0), held, long


_WORKER: _RowMaker | None = None


def _init_worker(tokenizer_json: str, tokenizer_config: dict, *args) -> None:
  import tokenizers
  global _WORKER
  backend = tokenizers.Tokenizer.from_str(tokenizer_json)
  _WORKER = _RowMaker(Tokenizer(backend, tokenizer_config), *args)


def _worker_rows(step: int):
  return _WORKER.rows(step)


class StreamBatches:
  """Batches of fresh problems, drawn ahead by worker processes.

  A drop-in for `data.Batches` in `train.train`: `stream(step)` gives the
  batch dict of that step; `first_rows()` the rows of batch 0 (the fixed
  "train rows" the loop scores). Use as a context manager (or call close)
  to stop the workers."""

  def __init__(self, tokenizer: Tokenizer, seq_len: int, batch_size: int,
               seed: int = 0, data_seed: int = 0,
               exclude: Iterable[str] = (), eos_pad: str = "random",
               workers: int = 0, prefetch: int | None = None,
               phrasing: str = synthetic_gsm.DEFAULT_PHRASING):
    check_phrasing(phrasing)
    if eos_pad not in EOS_PAD:
      raise ValueError(f"eos_pad must be one of {EOS_PAD}, got {eos_pad!r}")
    if batch_size <= 0 or seq_len <= 0 or workers < 0:
      raise ValueError(f"need batch_size, seq_len > 0 and workers >= 0 (got "
                       f"{batch_size}, {seq_len}, {workers})")
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
    self.data_seed, self.eos_pad = data_seed, eos_pad
    args = (seq_len, batch_size, data_seed, frozenset(exclude), phrasing)
    self._local = _RowMaker(tokenizer, *args)
    self.workers, self.prefetch = workers, prefetch or 8 * max(workers, 1)
    self._pool = None
    if workers:
      self._pool = concurrent.futures.ProcessPoolExecutor(
          workers, mp_context=multiprocessing.get_context("spawn"),
          initializer=_init_worker,
          initargs=(tokenizer.backend.to_str(), tokenizer.config, *args))
    self._pending: dict[int, concurrent.futures.Future] = {}
    self._next = None
    self.replaced_held_out = self.replaced_long = 0  # over batches served

  def start(self, step: int) -> None:
    """Begin drawing from batch `step` on (before the first call; the loop's
    first call does it otherwise)."""
    if self._pool is None:
      return
    if self._next is None or (step not in self._pending
                              and step != self._next):
      for future in self._pending.values():  # a jump: draw from step on
        future.cancel()
      self._pending, self._next = {}, step
    for old in [s for s in self._pending if s < step]:
      self._pending.pop(old).cancel()
    while self._next < step + self.prefetch:
      self._pending[self._next] = self._pool.submit(_worker_rows, self._next)
      self._next += 1

  def rows(self, step: int) -> EncodedRows:
    """The rows of batch `step` (drawn ahead when workers > 0)."""
    if self._pool is not None:
      self.start(step)
      rows, held, long = self._pending.pop(step).result()
    else:
      rows, held, long = self._local.rows(step)
    self.replaced_held_out += held
    self.replaced_long += long
    return rows

  def first_rows(self) -> EncodedRows:
    return self._local.rows(0)[0]

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    rows = self.rows(step)
    length_B = pad_lengths(rows.min_len_M, self.seq_len, self.seed, step,
                           self.eos_pad)
    return rows_batch(rows, np.arange(self.batch_size), length_B)

  def close(self) -> None:
    if self._pool is not None:
      for future in self._pending.values():
        future.cancel()
      self._pool.shutdown(wait=True, cancel_futures=True)
      self._pool, self._pending = None, {}

  def __enter__(self) -> "StreamBatches":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
