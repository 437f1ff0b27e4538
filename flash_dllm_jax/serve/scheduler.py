"""The scheduler: one engine's decisions as pure functions of their inputs,
in vLLM's mould (v1 `Scheduler.schedule` / `update_from_output`).

`schedule(waiting, running, releasing, free_slots, now)` -> a
`SchedulerOutput` for the next device call: the requests that fail before
it (cancelled or past their deadline, queued or decoding), the slots to
stop, the waiting requests each free slot takes (in arrival order, as many
as the model runner has free), and what is left waiting and running.
`update_from_output(scheduler_output, runner_output, now)` -> the
`EngineCoreOutputs` the call's output (`model_runner.ModelRunnerOutput`)
makes of it: each request's event (new final text, or its answer), its new
state (`RequestUpdate`: answer text, first-token time), what keeps running,
and the slots whose answer completed before their loop stopped (released at
the next call).

Neither touches a thread, a lock, a metric, the device or a request: the
engine core (engine_core.EngineCore) owns those, applies the updates
(`apply`) and hands the metrics each output.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

from flash_dllm_jax.serve.events import Event, Request
from flash_dllm_jax.serve.text import AnswerText


class SchedulerOutput(NamedTuple):
  """failed: (request, 'cancelled' | 'deadline'); release: slots to stop;
  admit: (slot, request) loaded by this call; waiting / running: after it
  (running maps slot -> request, including the admitted)."""

  failed: tuple[tuple[Request, str], ...]
  release: tuple[int, ...]
  admit: tuple[tuple[int, Request], ...]
  waiting: tuple[Request, ...]
  running: dict[int, Request]


class RequestUpdate(NamedTuple):
  """A request's new state: its answer text, and when its first token came
  (None: not yet)."""

  request: Request
  answer: AnswerText
  first_token_at: float | None


class EngineCoreOutputs(NamedTuple):
  """events: (request, event) in slot order, the last of a request carrying
  done=True; updates: each running request's new state; finished: requests
  answered by this call; running: what still decodes; release: slots to
  stop at the next call."""

  events: tuple[tuple[Request, Event], ...]
  updates: tuple[RequestUpdate, ...]
  finished: tuple[Request, ...]
  running: dict[int, Request]
  release: frozenset[int]


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
             releasing: frozenset[int] | set[int],
             free_slots: Callable[[set[int]], list[int]],
             now: float) -> SchedulerOutput:
  """See the module docstring. free_slots(releasing): the slots the engine
  can load at its next call counting `releasing` as free."""
  failed = []
  keep_waiting = []
  for r in waiting:
    why = stale(r, now)
    (failed.append((r, why)) if why else keep_waiting.append(r))
  release = set(releasing)
  still = {}
  for slot, r in running.items():
    why = stale(r, now)
    if why:
      failed.append((r, why))
      release.add(slot)
    else:
      still[slot] = r
  admit = []
  for slot in free_slots(release):
    if not keep_waiting:
      break
    admit.append((slot, keep_waiting.pop(0)))
  still.update(admit)
  return SchedulerOutput(tuple(failed), tuple(sorted(release)), tuple(admit),
              tuple(keep_waiting), still)


def _alternatives(out, slot: int, k: int) -> tuple | None:
  """The slot's first k alternatives ((id, log-prob) pairs) per generated
  position, or None (none asked, or the call recorded none)."""
  if not k or out.top_logprobs_BxGxK is None:
    return None
  lp_GxK = out.top_logprobs_BxGxK[slot, :, :k].tolist()
  id_GxK = out.top_ids_BxGxK[slot, :, :k].tolist()
  return tuple(tuple(zip(i, v)) for i, v in zip(id_GxK, lp_GxK))


def update_from_output(scheduled: SchedulerOutput, out,
                       now: float) -> EngineCoreOutputs:
  """See the module docstring. out: the model runner's ModelRunnerOutput."""
  events, updates, finished, running, release = [], [], [], {}, set()
  for slot, r in sorted(scheduled.running.items()):
    start = r.answer.ids_sent
    row_done = bool(out.done_B[slot])
    progress, answer = r.answer.update(out.tokens_BxG[slot], row_done)
    lp_G = None if out.logprobs_BxG is None else out.logprobs_BxG[slot]
    new_lp = () if lp_G is None else tuple(
        float(x) for x in lp_G[start:start + len(progress.new_ids)])
    top = _alternatives(out, slot, r.top_logprobs)
    new_top = None if top is None else \
        top[start:start + len(progress.new_ids)]
    first = r.first_token_at
    if (progress.new_ids or progress.done) and first is None:
      first = now
    updates.append(RequestUpdate(r, answer, first))
    if not progress.done:
      running[slot] = r
      if progress.delta or progress.new_ids:
        events.append((r, Event(progress.delta,
                                new_ids=tuple(progress.new_ids),
                                new_logprobs=new_lp, new_top=new_top)))
      continue
    if not row_done:
      release.add(slot)  # complete before its loop stopped
    n = len(progress.token_ids)
    usage = {"prompt_tokens": len(r.ids), "completion_tokens": n,
             "total_tokens": len(r.ids) + n,
             "decode_steps": int(out.steps_B[slot]),
             "forward_passes": int(out.forwards_B[slot])}
    final_lp = None if lp_G is None else [float(x) for x in lp_G[:n]]
    events.append((r, Event(progress.delta, True, progress.reason,
                            progress.token_ids, usage,
                            tuple(progress.new_ids), final_lp, new_lp,
                            None if top is None else list(top[:n]),
                            new_top)))
    finished.append(r)
  return EngineCoreOutputs(tuple(events), tuple(updates), tuple(finished),
                           running, frozenset(release))
