"""The scheduler: one engine's decisions as pure functions of their inputs,
in vLLM's mould (v1 `Scheduler.schedule` / `update_from_output`).

`schedule(waiting, running, capacity, now)` -> a `SchedulerOutput` for the
next device call: the requests that fail before it (cancelled or past
their deadline, queued or decoding), the slots to stop (those, and rows
whose answer completed before the row stopped: a stop string,
max_tokens), the waiting requests the call takes as its queue (in arrival
order, up to `capacity`; the device loads them into slots as rows finish,
model_runner.py), and what is left waiting and running. After the call,
`placed(scheduler_output, runner_output)` says which slot holds which
request, which queue entries the device loaded (and after which step),
and which it did not (they wait again, first in line).
`update_from_output(scheduler_output, runner_output, now)` -> the
`EngineCoreOutputs` the call's output (`model_runner.ModelRunnerOutput`)
makes of it: each request's event (new final text, or its answer) and its
new state (`RequestUpdate`: answer text, first-token time).
`call_steps(scheduler_output, slots, steps_per_call, short)` -> the next
call's step limit.

None of them touches a thread, a lock, a metric, the device or a request:
the engine core (engine_core.EngineCore) owns those, applies the updates
(`apply`) and hands the metrics each output.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from flash_dllm_jax.serve.events import Event, Request
from flash_dllm_jax.serve.text import AnswerText


class SchedulerOutput(NamedTuple):
  """failed: (request, 'cancelled' | 'deadline'); release: slots to stop;
  queued: the requests the call's queue holds (loaded in order into slots
  as they free up); waiting: what stays on the host; running: slot ->
  request the call starts with (after the releases)."""

  failed: tuple[tuple[Request, str], ...]
  release: tuple[int, ...]
  queued: tuple[Request, ...]
  waiting: tuple[Request, ...]
  running: dict[int, Request]


class Placement(NamedTuple):
  """After a call: running: slot -> request of every row still decoding
  (answered or not); loaded: (request, the loop step after which it was
  loaded, 0 the call's start) for each queue entry the call took; requeue:
  the queue entries it did not take, in order."""

  running: dict[int, Request]
  loaded: tuple[tuple[Request, int], ...]
  requeue: tuple[Request, ...]


class RequestUpdate(NamedTuple):
  """A request's new state: its answer text, and when its first token came
  (None: not yet)."""

  request: Request
  answer: AnswerText
  first_token_at: float | None


class EngineCoreOutputs(NamedTuple):
  """events: (request, event) in job order, the last of a request carrying
  done=True; updates: each decoded request's new state; finished: requests
  answered by this call."""

  events: tuple[tuple[Request, Event], ...]
  updates: tuple[RequestUpdate, ...]
  finished: tuple[Request, ...]


def apply(outputs: EngineCoreOutputs) -> None:
  """Writes each request's new state (the engine core's, after an
  update)."""
  for u in outputs.updates:
    u.request.answer, u.request.first_token_at = u.answer, u.first_token_at


def stale(request: Request, now: float) -> str | None:
  """'cancelled', 'deadline' or None."""
  if request.cancelled:
    return "cancelled"
  if request.deadline is not None and now > request.deadline:
    return "deadline"
  return None


def schedule(waiting: Sequence[Request], running: Mapping[int, Request],
             capacity: int, now: float) -> SchedulerOutput:
  """See the module docstring. running: slot -> request of each row the
  device decodes (Placement.running); capacity: the call's queue size."""
  failed = []
  keep_waiting = []
  for r in waiting:
    why = stale(r, now)
    (failed.append((r, why)) if why else keep_waiting.append(r))
  release = []
  still = {}
  for slot, r in running.items():
    why = None if r.finished else stale(r, now)
    if why:
      failed.append((r, why))
    if why or r.finished:  # failed, or answered before its row stopped
      release.append(slot)
    else:
      still[slot] = r
  return SchedulerOutput(tuple(failed), tuple(sorted(release)),
                         tuple(keep_waiting[:capacity]),
                         tuple(keep_waiting[capacity:]), still)


def call_steps(scheduled: SchedulerOutput, slots: int, steps_per_call: int,
               short: int | None) -> int:
  """The step limit of a continuous call: `short` (the server's
  steps_while_admitting; None: never) while nothing waits beyond the call's
  queue and either a slot is free at its start (an arrival soon gets one)
  or, with nothing queued, a running request has sent nothing yet (its
  first tokens go out that soon: a burst that fills the slots); else
  steps_per_call (no arrival could take a slot sooner; while requests
  queue, whole calls keep the device busy)."""
  if short and not scheduled.waiting and (
      len(scheduled.running) < slots
      or (not scheduled.queued and any(
          r.first_token_at is None for r in scheduled.running.values()))):
    return min(short, steps_per_call)
  return steps_per_call


def jobs(scheduled: SchedulerOutput, slots: int) -> dict[int, Request]:
  """job -> request of a call (model_runner.py): slot j's row at its start,
  or queue entry q as job slots + q."""
  out = dict(scheduled.running)
  out.update((slots + q, r) for q, r in enumerate(scheduled.queued))
  return out


def placed(scheduled: SchedulerOutput, out) -> Placement:
  """See the module docstring. out: the call's ModelRunnerOutput."""
  by_job = jobs(scheduled, len(out.job_B))
  running = {s: by_job[int(j)] for s, j in enumerate(out.job_B) if j >= 0}
  taken = scheduled.queued[:out.taken]
  return Placement(running, tuple((r, int(out.at_Q[q]))
                                  for q, r in enumerate(taken)),
                   scheduled.queued[out.taken:])


def _alternatives(out, job: int, k: int) -> tuple | None:
  """The job's first k alternatives ((id, log-prob) pairs) per generated
  position, or None (none asked, or the call recorded none)."""
  if not k or out.top_logprobs_JxGxK is None:
    return None
  lp_GxK = out.top_logprobs_JxGxK[job, :, :k].tolist()
  id_GxK = out.top_ids_JxGxK[job, :, :k].tolist()
  return tuple(tuple(zip(i, v)) for i, v in zip(id_GxK, lp_GxK))


def update_from_output(scheduled: SchedulerOutput, out,
                       now: float) -> EngineCoreOutputs:
  """See the module docstring. out: the model runner's ModelRunnerOutput.
  Requests answered already (their row ran on) get nothing."""
  events, updates, finished = [], [], []
  live = jobs(scheduled._replace(queued=scheduled.queued[:out.taken]),
              len(out.job_B))
  for job, r in sorted(live.items()):
    if r.finished:
      continue
    start = r.answer.ids_sent
    row_done = bool(out.done_J[job])
    progress, answer = r.answer.update(out.tokens_JxG[job], row_done)
    lp_G = None if out.logprobs_JxG is None else out.logprobs_JxG[job]
    new_lp = () if lp_G is None else tuple(
        lp_G[start:start + len(progress.new_ids)].tolist())
    top = _alternatives(out, job, r.top_logprobs)
    new_top = None if top is None else \
        top[start:start + len(progress.new_ids)]
    first = r.first_token_at
    if (progress.new_ids or progress.done) and first is None:
      first = now
    updates.append(RequestUpdate(r, answer, first))
    if not progress.done:
      if progress.delta or progress.new_ids:
        events.append((r, Event(progress.delta,
                                new_ids=tuple(progress.new_ids),
                                new_logprobs=new_lp, new_top=new_top)))
      continue
    n = len(progress.token_ids)
    usage = {"prompt_tokens": len(r.ids), "completion_tokens": n,
             "total_tokens": len(r.ids) + n,
             "decode_steps": int(out.steps_J[job]),
             "forward_passes": int(out.forwards_J[job])}
    final_lp = None if lp_G is None else lp_G[:n].tolist()
    events.append((r, Event(progress.delta, True, progress.reason,
                            progress.token_ids, usage,
                            tuple(progress.new_ids), final_lp, new_lp,
                            None if top is None else list(top[:n]),
                            new_top)))
    finished.append(r)
  return EngineCoreOutputs(tuple(events), tuple(updates), tuple(finished))
