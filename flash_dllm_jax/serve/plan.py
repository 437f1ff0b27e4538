"""One engine's scheduling decisions as functions of their inputs, in
vLLM's mould (v1 `Scheduler.schedule` / `update_from_output`).

`schedule(waiting, running, releasing, free_slots, now)` -> a `Plan` for the
next device call: the requests that fail before it (cancelled or past their
deadline, queued or decoding), the slots to stop, the waiting requests each
free slot takes (in arrival order, as many as the engine has free), and
what is left waiting and running. `update(plan, out, now)` -> the `Step`
the call's output (`engine.CycleOut`) makes of it: each request's event
(new final text, or its answer), what keeps running, and the slots whose
answer completed before their loop stopped (released at the next call).

Neither touches a thread, a lock, a metric or the device: the engine loop
(scheduler.Scheduler) owns those, and the metrics observe the plans and
steps. Only a request's `AnswerText` (its own text state) changes.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

from flash_dllm_jax.serve.events import Event, Request


class Plan(NamedTuple):
  """failed: (request, 'cancelled' | 'deadline'); release: slots to stop;
  admit: (slot, request) loaded by this call; waiting / running: after it
  (running maps slot -> request, including the admitted)."""

  failed: tuple[tuple[Request, str], ...]
  release: tuple[int, ...]
  admit: tuple[tuple[int, Request], ...]
  waiting: tuple[Request, ...]
  running: dict[int, Request]


class Step(NamedTuple):
  """events: (request, event) in slot order, the last of a request carrying
  done=True; finished: requests answered by this step; running: what still
  decodes; release: slots to stop at the next call."""

  events: tuple[tuple[Request, Event], ...]
  finished: tuple[Request, ...]
  running: dict[int, Request]
  release: frozenset[int]


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
             now: float) -> Plan:
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
  return Plan(tuple(failed), tuple(sorted(release)), tuple(admit),
              tuple(keep_waiting), still)


def update(plan: Plan, out, now: float) -> Step:
  """See the module docstring. out: the engine's CycleOut."""
  events, finished, running, release = [], [], {}, set()
  for slot, r in sorted(plan.running.items()):
    start = r.answer.ids_sent
    row_done = bool(out.done_B[slot])
    progress = r.answer.update(out.tokens_BxG[slot], row_done)
    lp_G = None if out.logprobs_BxG is None else out.logprobs_BxG[slot]
    new_lp = () if lp_G is None else tuple(
        float(x) for x in lp_G[start:start + len(progress.new_ids)])
    if (progress.new_ids or progress.done) and r.first_token_at is None:
      r.first_token_at = now
    if not progress.done:
      running[slot] = r
      if progress.delta or progress.new_ids:
        events.append((r, Event(progress.delta,
                                new_ids=tuple(progress.new_ids),
                                new_logprobs=new_lp)))
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
                            tuple(progress.new_ids), final_lp, new_lp)))
    finished.append(r)
  return Step(tuple(events), tuple(finished), running, frozenset(release))
