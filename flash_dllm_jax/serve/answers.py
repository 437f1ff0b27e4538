"""A request's events, as the routes answer them: one JSON body (`whole`)
or an SSE stream (`stream`), with the choices' logprobs (an echoed prompt's
first), usage, and the failures (deadline, shutdown, engine error) as
their HTTP status or stream error."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi.responses import Response

from flash_dllm_jax.serve import protocol as P
from flash_dllm_jax.serve.errors import error_response as _error, sse_error
from flash_dllm_jax.serve.events import Event

_FAILED = {"deadline": (504, "the request's deadline passed", "timeout"),
           "shutdown": (503, "the server shut down before answering",
                        "server_shutdown"),
           "error": (500, "the decoding engine failed", "engine_error")}
# Seconds past a request's deadline before its handler answers 504 itself:
# the engine thread fails expired requests, and this backstop holds even
# when that thread is stuck in a device call.
DEADLINE_GRACE_S = 2.0


async def _next_event(events: asyncio.Queue, deadline: float | None,
                      poll: float | None = None):
  """The next (index, Event); a 'deadline' Event for index -1 once the
  deadline plus DEADLINE_GRACE_S passed; None after `poll` seconds."""
  wait = None if deadline is None else \
      deadline + DEADLINE_GRACE_S - time.monotonic()
  if poll is not None:
    wait = poll if wait is None else min(wait, poll)
  if wait is None:
    return await events.get()
  try:
    if wait <= 0:
      raise TimeoutError
    if not events.empty():
      return events.get_nowait()
    async with asyncio.timeout(wait):  # a timer: no task, as wait_for makes
      return await events.get()
  except TimeoutError:
    if deadline is not None and time.monotonic() >= \
        deadline + DEADLINE_GRACE_S:
      return -1, Event("", True, "deadline")
    return None


def _usage(events: list[Event], request) -> dict:
  """The choices' usage: each prompt once, the rest summed."""
  usage = dict(events[0].usage)
  for ev in events[1:]:
    for k in ("completion_tokens", "total_tokens", "decode_steps",
              "forward_passes"):
      usage[k] += ev.usage[k]
  usage["prompt_tokens"] = sum(len(ids) for ids in {
      id(r.ids): r.ids for r in request}.values())
  usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
  return usage


async def whole(service, request, events, http, rid, model, chat, decoding):
  text = [[] for _ in request]
  last: dict[int, Event] = {}
  try:
    while len(last) < len(request):
      got = await _next_event(events, request[0].deadline, 0.5)
      if got is None:
        if await http.is_disconnected():
          service.engine_core.abort_requests(request)
          return Response(status_code=499)
        continue
      i, ev = got
      if i < 0:
        i = next(j for j in range(len(request)) if j not in last)
      text[i].append(ev.delta)
      if ev.done:
        last[i] = ev
        if ev.reason in _FAILED:
          service.engine_core.abort_requests(request)  # the other choices
          status, message, code = _FAILED[ev.reason]
          return _error(status, message, None, code)
  except asyncio.CancelledError:
    service.engine_core.abort_requests(request)
    raise
  done = [last[i] for i in range(len(request))]
  choices = []
  for i, ev in enumerate(done):
    r = request[i]
    lp = _logprobs(service, r, chat, ev.token_ids, ev.logprobs, 0,
                   ev.top_logprobs)
    if r.echo is not None:
      lp = _join(_echo_logprobs(service, r), lp)
    choices.append({"index": i, "text": (r.echo or "") + "".join(text[i]),
                    "finish_reason": ev.reason, "token_ids": ev.token_ids,
                    "logprobs": lp})
  body = P.chat_body if chat else P.completion_body
  return body(rid, model, choices, _usage(done, request), decoding)


def _logprobs(service, request, chat, ids, logprobs, offset=0, top=None):
  """A choice's `logprobs` field (None unless asked for). top: each
  token's alternatives ((id, log-prob) pairs, Event.top_logprobs); None
  where the sampler records none: {} each where some were asked for."""
  if not request.logprobs or logprobs is None:
    return None
  strings = service.token_strings(ids)
  alts = None if top is None else [
      list(zip(service.token_strings([i for i, _ in a]), [v for _, v in a]))
      for a in top]
  if chat:
    return P.chat_logprobs(strings, list(logprobs), alts)
  tops = None if not request.top_logprobs else (
      [_first_of_each(a) for a in alts] if alts is not None
      else [{} for _ in ids])
  return P.completion_logprobs(strings, list(logprobs), offset, tops)


def _first_of_each(pairs) -> dict:
  """{text: log-prob}, likeliest first, keeping the likeliest of tokens
  whose texts are equal."""
  out = {}
  for text, value in pairs:
    out.setdefault(text, value)
  return out


def _echo_logprobs(service, request):
  """The echoed prompt's `logprobs` (prompt_logprobs.py), or None."""
  if request.prompt_logprobs is None:
    return None
  own, alternatives = request.prompt_logprobs
  k = request.top_logprobs
  top = None if not k else [
      None if alt is None else {s: v for s, (_, v) in zip(
          service.token_strings([a for a, _ in alt[:k]]), alt[:k])}
      for alt in alternatives]
  return P.completion_logprobs(service.token_strings(request.ids), own, 0,
                               top)


def _join(first, then):
  """Two completion `logprobs` one after the other (None: absent)."""
  if first is None or then is None:
    return first or then
  shift = sum(len(t) for t in first["tokens"])
  top = None if first["top_logprobs"] is None else \
      first["top_logprobs"] + (then["top_logprobs"] or [])
  return {"tokens": first["tokens"] + then["tokens"],
          "token_logprobs": first["token_logprobs"] + then["token_logprobs"],
          "top_logprobs": top,
          "text_offset": first["text_offset"] + [
              o + shift for o in then["text_offset"]]}


def _sse(obj) -> str:
  return f"data: {json.dumps(obj)}\n\n"


async def stream(service, request, events, rid, model, chat, decoding,
                  include_usage):
  chunk = ((lambda t, r=None, ids=(), i=0, lp=None: P.chat_chunk(
      rid, model, {"content": t}, r, ids, i, lp)) if chat else
           (lambda t, r=None, ids=(), i=0, lp=None: P.completion_chunk(
               rid, model, t, r, ids, i, lp)))
  offsets = [0] * len(request)  # text_offset of each choice's next token
  last: dict[int, Event] = {}
  failed = None
  out = []  # SSE text not yet sent: one body chunk while events keep coming
  try:
    if chat:
      for i in range(len(request)):
        out.append(_sse(P.chat_chunk(rid, model, {"role": "assistant",
                                                  "content": ""}, index=i)))
    for i, r in enumerate(request):
      if r.echo is not None:  # the prompt first, as vLLM streams it
        lp = _echo_logprobs(service, r)
        if lp is not None:
          offsets[i] = len("".join(lp["tokens"]))
        out.append(_sse(chunk(r.echo, None, (), i, lp)))
    while len(last) < len(request):
      if out and events.empty():
        yield "".join(out)
        out = []
      i, ev = await _next_event(events, request[0].deadline)
      if ev.reason in _FAILED:
        failed = ev
        last[i] = ev
        break
      if ev.delta or ev.new_ids:
        lp = _logprobs(service, request[i], chat, ev.new_ids,
                       ev.new_logprobs, offsets[i], ev.new_top)
        if lp is not None and not chat:
          offsets[i] += sum(len(t) for t in lp["tokens"])
        out.append(_sse(chunk(ev.delta, None, ev.new_ids, i, lp)))
      if ev.done:
        last[i] = ev
        out.append(_sse(chunk("", ev.reason, (), i)))
    if failed is not None:
      service.engine_core.abort_requests(request)  # the other choices
      status, message, code = _FAILED[failed.reason]
      out.append(sse_error(message, code))
    elif include_usage:
      obj = "chat.completion.chunk" if chat else "text_completion"
      out.append(_sse(P.usage_chunk(
          rid, model, obj, _usage([last[i] for i in range(len(request))],
                                  request), decoding)))
    out.append("data: [DONE]\n\n")
    yield "".join(out)
  finally:
    if len(last) < len(request) and failed is None:
      service.engine_core.abort_requests(request)  # the client went away
