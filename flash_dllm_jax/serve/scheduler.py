"""The host side of serving: a bounded queue and one thread that owns the
device slots.

The thread loops over the engines (one per sampler variant and prompt-length
bucket): at each admission point it fails requests past their deadline or
cancelled (a client gone), releases their slots, loads waiting requests into
free slots, and runs the compiled loop (`SlotEngine.cycle`) once. After each call it sends every busy request
the text that became final, and finishes a request as soon as its answer is
complete (its slot is released at the next call). Every request is answered
exactly once, through its `emit` callback, from this thread.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable, NamedTuple

from flash_dllm_jax.serve.engine import SlotEngine
from flash_dllm_jax.serve.metrics import Metrics
from flash_dllm_jax.serve.text import AnswerText

log = logging.getLogger("flash_dllm_jax.serve")


class QueueFull(Exception):
  """The waiting queue is at its limit (HTTP 429)."""


class Draining(Exception):
  """The server is shutting down and admits nothing new (HTTP 503)."""


class Event(NamedTuple):
  """delta: newly final text. On the last event, done is True and reason is
  'stop' / 'length' (answered) or 'deadline' / 'cancelled' / 'shutdown'
  (failed); usage and token_ids come with an answer."""

  delta: str
  done: bool = False
  reason: str | None = None
  token_ids: list[int] | None = None
  usage: dict | None = None
  new_ids: tuple[int, ...] = ()


_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Request:
  """ids: the prompt's token ids; key: its engine's key (in the server:
  (variant, padded prompt length)); deadline: a time.monotonic() value or
  None; emit: called (from the engine thread) with each Event; decoding: the
  settings reported with the answer."""

  ids: list[int]
  key: object
  seed: int
  answer: AnswerText
  emit: Callable[[Event], None]
  deadline: float | None = None
  arrived: float = dataclasses.field(default_factory=time.monotonic)
  number: int = dataclasses.field(default_factory=lambda: next(_ids))
  decoding: dict | None = None
  cancelled: bool = False
  first_token_at: float | None = None
  finished: bool = False


class Scheduler:
  """engines: {key: SlotEngine} (the server keys them by (variant,
  bucket)); max_queue: waiting requests allowed."""

  def __init__(self, engines: dict[int, SlotEngine], metrics: Metrics,
               max_queue: int):
    self.engines, self.metrics, self.max_queue = engines, metrics, max_queue
    self._pending = {p: collections.deque() for p in engines}
    self._slots = {p: {} for p in engines}  # key -> {slot: Request}
    self._release = {p: set() for p in engines}
    self._cond = threading.Condition()
    self._draining = self._stopping = False
    self._thread = threading.Thread(target=self._run, name="dllm-engine",
                                    daemon=True)
    metrics.slots.set(sum(e.b for e in engines.values()))

  # Called from the server's threads ---------------------------------------
  def start(self) -> None:
    self._thread.start()

  def submit(self, request: Request) -> None:
    with self._cond:
      if self._draining:
        raise Draining("the server is shutting down")
      if self.queue_length() >= self.max_queue:
        raise QueueFull(f"{self.max_queue} requests are already waiting")
      self._pending[request.key].append(request)
      self.metrics.queue_length.set(self.queue_length())
      self._cond.notify()

  def cancel(self, request: Request) -> None:
    """The client is gone: the request's slot frees at the next admission
    point (it gets no further events)."""
    with self._cond:
      request.cancelled = True
      self._cond.notify()

  def queue_length(self) -> int:
    return sum(len(q) for q in self._pending.values())

  def drain(self) -> None:
    """Stop admitting; what is queued or decoding still finishes."""
    with self._cond:
      self._draining = True

  def stop(self, timeout: float = 30.0) -> None:
    """Fails whatever is left with reason 'shutdown' and ends the thread."""
    with self._cond:
      self._draining = self._stopping = True
      self._cond.notify()
    self._thread.join(timeout)

  @property
  def draining(self) -> bool:
    return self._draining

  # The engine thread --------------------------------------------------------
  def _finish(self, request: Request, event: Event, outcome: str) -> None:
    if request.finished:
      raise RuntimeError(f"request {request.number} answered twice")
    request.finished = True
    self.metrics.requests.labels(outcome).inc()
    if event.usage is not None:
      self.metrics.latency.observe(time.monotonic() - request.arrived)
    if not request.cancelled:
      request.emit(event)

  def _fail_stale(self, now: float) -> None:
    """Removes cancelled or expired requests from the queues and slots."""
    with self._cond:
      for p, queue in self._pending.items():
        for r in [r for r in queue if r.cancelled or _expired(r, now)]:
          queue.remove(r)
          self._finish(r, Event("", True, "cancelled" if r.cancelled
                                else "deadline"),
                       "cancelled" if r.cancelled else "deadline")
    for p, slots in self._slots.items():
      for slot, r in list(slots.items()):
        if r.cancelled or _expired(r, now):
          del slots[slot]
          self._release[p].add(slot)
          self._finish(r, Event("", True, "cancelled" if r.cancelled
                                else "deadline"),
                       "cancelled" if r.cancelled else "deadline")

  def _idle(self) -> bool:
    return not any(self._slots.values()) and not any(self._release.values()) \
        and self.queue_length() == 0

  def _run(self) -> None:
    try:
      while True:
        with self._cond:
          while self._idle() and not self._stopping:
            self._cond.wait()
          if self._stopping:
            break
        self._fail_stale(time.monotonic())
        for p in self.engines:
          self._cycle(p)
    except Exception:  # noqa: BLE001 - fail every request, then re-raise
      log.exception("the engine thread failed")
      self._fail_all("error")
      raise
    self._fail_all("shutdown")

  def _fail_all(self, outcome: str) -> None:
    with self._cond:
      left = [r for q in self._pending.values() for r in q]
      left += [r for s in self._slots.values() for r in s.values()]
      for q in self._pending.values():
        q.clear()
      for s in self._slots.values():
        s.clear()
    for r in left:
      if not r.finished:
        self._finish(r, Event("", True, outcome), outcome)

  def _cycle(self, p: int) -> None:
    engine, slots, release = self.engines[p], self._slots[p], self._release[p]
    admit = {}
    with self._cond:
      for slot in engine.free_slots(release):
        if not self._pending[p]:
          break
        r = self._pending[p].popleft()
        slots[slot] = r
        admit[slot] = (r.ids, r.seed)
      self.metrics.queue_length.set(self.queue_length())
    if not slots and not release:
      return
    t0 = time.monotonic()
    for slot in admit:
      self.metrics.admission.observe(t0 - slots[slot].arrived)
      self.metrics.prompt_tokens.inc(len(slots[slot].ids))
    out = engine.cycle(release=sorted(release), admit=admit)
    release.clear()
    self.metrics.cycle.observe(time.monotonic() - t0)
    self.metrics.round_trips.inc()
    self.metrics.decode_steps.inc(out.iters)
    now = time.monotonic()
    for slot, r in list(slots.items()):
      progress = r.answer.update(out.tokens_BxG[slot], bool(out.done_B[slot]))
      if (progress.new_ids or progress.done) and r.first_token_at is None:
        r.first_token_at = now
        self.metrics.ttft.observe(now - r.arrived)
      if not progress.done:
        if (progress.delta or progress.new_ids) and not r.cancelled:
          r.emit(Event(progress.delta, new_ids=tuple(progress.new_ids)))
        continue
      del slots[slot]
      if not out.done_B[slot]:
        release.add(slot)  # complete before its loop stopped
      if r.answer.revised:
        self.metrics.text_revisions.inc()
        log.error("request %d: final text revised streamed text", r.number)
      n = len(progress.token_ids)
      self.metrics.generated_tokens.inc(n)
      usage = {"prompt_tokens": len(r.ids), "completion_tokens": n,
               "total_tokens": len(r.ids) + n,
               "decode_steps": int(out.steps_B[slot]),
               "forward_passes": int(out.forwards_B[slot])}
      self._finish(r, Event(progress.delta, True, progress.reason,
                            progress.token_ids, usage,
                            tuple(progress.new_ids)), "ok")
    self.metrics.busy_slots.set(sum(len(s) for s in self._slots.values()))


def _expired(request: Request, now: float) -> bool:
  return request.deadline is not None and now > request.deadline
