"""The engine core (vLLM's `EngineCore`): a bounded queue per model runner
and one thread that owns the device slots and runs the loop.

The thread (`run_busy_loop`) takes a `step` of each model runner in turn
(one slot pool per sampler variant, shared by every prompt length). A step
collects the device call in flight (`ModelRunner.collect`; `scheduler.
placed`: which slot holds which request, which queued requests the device
loaded, the others wait again first in line), asks the scheduler
(`scheduler.schedule`) what the next call does (fail cancelled or expired
requests, stop their slots and those of answered rows, hand the device
the waiting requests as its queue, loaded into slots as rows finish inside
the compiled loop) and dispatches it (`ModelRunner.dispatch`,
asynchronous), and only then hands the collected output to
`scheduler.update_from_output`, which says what each request gets (the
text that became final, or its answer) and its new state, which the step
applies (`scheduler.apply`).

The thread is supervised: an exception in it or in a device call fails the
requests the runners hold (reason 'error', a 500) and restarts them
(`ModelRunner.reset`: fresh slot state, the compiled program kept); what
waits in the queue stays queued. A failure within `RESTART_WINDOW_S` of
`MAX_RESTARTS` others, or one while restarting, is fatal: everything left
fails, new requests are refused (503), /health says 'failed' and
`on_fatal` runs (the CLI stops the server, exit status 1, for an
orchestrator to restart it). So detokenizing and sending run while the
device decodes the next call, and a slot whose row stopped is refilled on
the device at once; a slot whose answer completed before its row stopped
(a stop string, max_tokens) is released a call later. The metrics observe
each placement and scheduler output (`Metrics.observe_*`). Every request
is answered exactly once, through its `emit` callback, from this thread;
a step's events reach each HTTP event loop together, in order, at the
step's end (`events.batched_posts`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import NamedTuple

from flash_dllm_jax.serve import scheduler
from flash_dllm_jax.serve.events import (  # noqa: F401
    Event, Request, batched_posts)
from flash_dllm_jax.serve.model_runner import ModelRunner
from flash_dllm_jax.serve.metrics import Metrics
from flash_dllm_jax.serve.supervision import (  # noqa: F401
    MAX_RESTARTS, RESTART_WINDOW_S, Draining, EngineFailed, QueueFull,
    recent_restarts)

log = logging.getLogger("flash_dllm_jax.serve")


class EngineCore:
  """runners: {key: ModelRunner} (the server keys them by variant);
  max_queue: waiting requests allowed; steps_while_admitting: the step
  limit of a continuous runner's call while its pool takes new requests
  (`_dispatch`; None: steps_per_call always)."""

  def __init__(self, runners: dict[int, ModelRunner], metrics: Metrics,
               max_queue: int, on_fatal=None,
               steps_while_admitting: int | None = None):
    self.runners, self.metrics, self.max_queue = runners, metrics, max_queue
    self.steps_while_admitting = steps_while_admitting
    self.on_fatal = on_fatal  # called (no arguments) once the engine is lost
    self.state = "ready"  # 'restarting' while rebuilt, 'failed' for good
    self.restarts: list[float] = []  # time.monotonic() of each restart
    self._pending = {p: collections.deque() for p in runners}
    self._slots = {p: {} for p in runners}  # key -> {slot: Request}
    self._in_flight = {}  # key -> _Call dispatched, not yet collected
    self._cond = threading.Condition()
    self._draining = self._stopping = False
    self._thread = threading.Thread(target=self._run, name="dllm-engine",
                                    daemon=True)
    metrics.slots.set(sum(e.b for e in runners.values()))

  # Called from the server's threads ---------------------------------------
  def start(self) -> None:
    self._thread.start()

  def add_request(self, request: Request | list[Request]) -> None:
    """Queues a request, or all of a list (one HTTP request's n choices) or
    none of them."""
    group = request if isinstance(request, list) else [request]
    with self._cond:
      self.check_open()
      if self.queue_length() + len(group) > self.max_queue:
        raise QueueFull(f"{self.max_queue} requests are already waiting")
      for r in group:
        self._pending[r.key].append(r)
      self.metrics.queue_length.set(self.queue_length())
      self._cond.notify()

  def check_open(self) -> None:
    """EngineFailed or Draining where nothing new is admitted (requests
    decoded outside the slot pool ask it too)."""
    if self.state == "failed":
      raise EngineFailed("the decoding engine failed; the server is "
                         "stopping")
    if self._draining:
      raise Draining("the server is shutting down")

  def abort_requests(self, request: Request | list[Request]) -> None:
    """The client is gone: the request's slot (a list: each one's) frees at
    the next admission point (it gets no further events)."""
    with self._cond:
      for r in request if isinstance(request, list) else [request]:
        r.cancelled = True
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

  @property
  def thread(self) -> threading.Thread:
    """The engine thread (a benchmark reads its CPU time)."""
    return self._thread

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

  def _idle(self) -> bool:
    return not self._in_flight and not any(self._slots.values()) and \
        self.queue_length() == 0

  def _run(self) -> None:
    while True:
      try:
        self.run_busy_loop()
        break
      except Exception:  # noqa: BLE001 - supervised: fail, then restart
        log.exception("the engine thread failed")
        if not self._restart():
          return
    self._fail_all("shutdown")

  def run_busy_loop(self) -> None:
    """Steps every model runner while there is work, until stopped."""
    while True:
      with self._cond:
        while self._idle() and not self._stopping:
          self._cond.wait()
        if self._stopping:
          return
      for key in self.runners:
        with batched_posts():  # a step's events: one wake-up per loop
          self.step(key)

  def _restart(self) -> bool:
    """After a failure: fails what the runners held and rebuilds them;
    False (and everything failed, on_fatal called) when that is not to be
    tried again or does not work."""
    now = time.monotonic()
    self.restarts, fatal = recent_restarts(self.restarts, now)
    self.state = "failed" if fatal else "restarting"  # before any answer
    try:
      if fatal:
        raise RuntimeError(f"{len(self.restarts) + 1} engine failures within "
                           f"{RESTART_WINDOW_S:.0f} s")
      self._fail_all("error", queued=False)
      self.restarts.append(now)
      for runner in self.runners.values():
        runner.reset()
      log.warning("restarted the engine in %.2f s (%d restart(s) within "
                  "%.0f s)", time.monotonic() - now, len(self.restarts),
                  RESTART_WINDOW_S)
      self.state = "ready"
      return True
    except Exception:  # noqa: BLE001 - fatal: fail everything, stop
      log.exception("the engine failed for good")
      self.state = "failed"
      self._fail_all("error")
      if self.on_fatal is not None:
        self.on_fatal()
      return False

  def _fail_all(self, outcome: str, queued: bool = True) -> None:
    """Fails what the runners hold (slots, calls in flight) and, if
    `queued`, what waits."""
    with self._cond:
      left = [r for q in self._pending.values() for r in q] if queued else []
      left += [r for s in self._slots.values() for r in s.values()]
      left += [r for c in self._in_flight.values()
               for r in (*c.plan.running.values(), *c.plan.queued)]
      if queued:
        for q in self._pending.values():
          q.clear()
      for s in self._slots.values():
        s.clear()
      self._in_flight.clear()
      self.metrics.queue_length.set(self.queue_length())
    for r in left:
      if not r.finished:
        self._finish(r, Event("", True, outcome), outcome)

  def step(self, key) -> None:
    """One device call of model runner `key`: collect the call in flight,
    schedule and dispatch the next, then turn the collected output into
    events while the device runs (JAX dispatches asynchronously)."""
    runner = self.runners[key]
    # a call stays in _in_flight until collected, and is put there before
    # its dispatch, so a failure in either fails its requests (_fail_all)
    last = self._in_flight.get(key)
    collected = time.monotonic()
    if last is not None:
      out = runner.collect(last.handle)
      del self._in_flight[key]
      collected = time.monotonic()
      seconds = time.monotonic() - last.started
      where = scheduler.placed(last.plan, out)
      self.metrics.observe_loaded(where.loaded, last.started, seconds,
                                  out.iters)
    with self._cond:
      if last is not None:
        self._slots[key] = where.running
        self._pending[key].extendleft(reversed(where.requeue))
      plan = scheduler.schedule(self._pending[key], self._slots[key],
                                runner.q, time.monotonic())
      self._pending[key] = collections.deque(plan.waiting)
      self._slots[key] = plan.running
      self.metrics.queue_length.set(self.queue_length())
    for r, why in plan.failed:
      self._finish(r, Event("", True, why), why)
    try:
      if plan.queued or plan.release or plan.running:
        self._dispatch(key, plan)
        self.metrics.host_gap.observe(time.monotonic() - collected)
    finally:  # the collected call's answers go out even if that failed
      if last is not None:
        self._answer(last.plan, out, seconds)

  def _dispatch(self, key, plan: scheduler.SchedulerOutput) -> None:
    """Starts runner `key`'s next call, of `scheduler.call_steps` steps (a
    continuous runner's short calls while its pool admits, or while a row
    has sent nothing yet and none is queued; else steps_per_call)."""
    runner = self.runners[key]
    # the top-logprobs variant while a request that wants them decodes
    top = runner.top_k > 0 and any(
        r.top_logprobs for r in (*plan.running.values(), *plan.queued))
    steps = scheduler.call_steps(
        plan, runner.b, runner.k,
        self.steps_while_admitting if runner.continuous else None)
    self._in_flight[key] = _Call(plan, time.monotonic(), None)
    self._in_flight[key] = _Call(plan, time.monotonic(), runner.dispatch(
        release=plan.release, queue=[
            (r.ids, r.seed) if r.sampling is None else
            (r.ids, r.seed, r.sampling) for r in plan.queued], top=top,
        steps=steps))

  def _answer(self, plan: scheduler.SchedulerOutput, out,
              seconds: float) -> None:
    """The events of a collected call. A request whose answer completed
    before its row stopped keeps its slot until the next schedule releases
    it (one call later than without the overlap)."""
    now = time.monotonic()
    outputs = scheduler.update_from_output(plan, out, now)
    scheduler.apply(outputs)
    self.metrics.observe_step(outputs, out, seconds, now)
    for r in outputs.finished:
      if r.answer.revised:
        log.error("request %d: final text revised streamed text", r.number)
    for r, ev in outputs.events:
      if ev.done:
        self._finish(r, ev, "ok")
      elif not r.cancelled:
        r.emit(ev)
    self.metrics.busy_slots.set(sum(
        not r.finished for s in self._slots.values() for r in s.values()))


class _Call(NamedTuple):
  """A dispatched device call: its plan, start time and runner handle."""

  plan: scheduler.SchedulerOutput
  started: float
  handle: object
