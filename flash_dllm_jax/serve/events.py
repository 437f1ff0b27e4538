"""What flows between the routes and the engine loop: a `Request` (one
choice of an HTTP request), the `Event`s that answer it, and `post`, which
hands them to a route's event loop."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from typing import Callable, NamedTuple

from flash_dllm_jax.serve.text import AnswerText


class Event(NamedTuple):
  """delta: newly final text. On the last event, done is True and reason is
  'stop' / 'length' (answered) or 'deadline' / 'cancelled' / 'shutdown'
  (failed); usage, token_ids and logprobs (theirs; None unless the sampler
  reports them) come with an answer. new_ids / new_logprobs: the answer
  ids that became final with this event, and their log-probabilities.
  top_logprobs / new_top: each token's alternatives ((id, log-prob) pairs,
  likeliest first) where the request asked for them."""

  delta: str
  done: bool = False
  reason: str | None = None
  token_ids: list[int] | None = None
  usage: dict | None = None
  new_ids: tuple[int, ...] = ()
  logprobs: list[float] | None = None
  new_logprobs: tuple[float, ...] = ()
  top_logprobs: list | None = None
  new_top: tuple | None = None


_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Request:
  """ids: the prompt's token ids; key: its engine's key (in the server: its
  variant); deadline: a time.monotonic() value or
  None; emit: called (from the engine thread) with each Event; decoding: the
  settings reported with the answer; sampling: its row's
  row_sampling.Sampling (None: greedy); index: the choice's index among its
  HTTP request's n; logprobs: the client asked for them; echo: the
  prompt's text to send before the answer (None: no echo);
  prompt_logprobs: (log-probs, alternatives) of the prompt's tokens
  (serve/prompt_logprobs.py), for echo with logprobs; top_logprobs: the
  alternatives asked per position (the prompt's with echo, and the
  answer's where the sampler records them)."""

  ids: list[int]
  key: object
  seed: int
  answer: AnswerText
  emit: Callable[[Event], None]
  deadline: float | None = None
  arrived: float = dataclasses.field(default_factory=time.monotonic)
  number: int = dataclasses.field(default_factory=lambda: next(_ids))
  decoding: dict | None = None
  sampling: object = None
  index: int = 0
  logprobs: bool = False
  cancelled: bool = False
  first_token_at: float | None = None
  finished: bool = False
  echo: str | None = None
  prompt_logprobs: tuple | None = None
  top_logprobs: int = 0  # alternatives asked per position
  grammar: str | None = None  # response_format's (serve/structured.py)


_held = threading.local()


def post(loop, callback, arg) -> None:
  """loop.call_soon_threadsafe(callback, arg), or, inside `batched_posts()`
  on this thread, held until it ends."""
  held = getattr(_held, "calls", None)
  if held is None:
    loop.call_soon_threadsafe(callback, arg)
  else:
    held.setdefault(loop, []).append((callback, arg))


@contextlib.contextmanager
def batched_posts():
  """Hands each event loop the `post`s made on this thread inside, in
  order, with one call_soon_threadsafe at the end. Each such call writes
  the loop's wake-up socket, where the engine thread may lose the GIL to
  the HTTP thread for a switch interval: once per step, not per event."""
  _held.calls = held = {}
  try:
    yield
  finally:
    _held.calls = None
    for loop, calls in held.items():
      loop.call_soon_threadsafe(_run_all, calls)


def _run_all(calls) -> None:
  for callback, arg in calls:
    callback(arg)
