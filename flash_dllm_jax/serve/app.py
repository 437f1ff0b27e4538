"""FastAPI routes: /v1/completions, /v1/chat/completions (JSON or SSE),
/v1/models (and /v1/models/{id}), /tokenize, /detokenize, /version,
/health and /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from typing import Callable

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from flash_dllm_jax.serve import protocol as P
from flash_dllm_jax.serve import tokens
from flash_dllm_jax.serve.body import parse_body
from flash_dllm_jax.serve.cli import MAX_BODY_BYTES
from flash_dllm_jax.serve.errors import (BadRequest, error_response as _error,
                                         sse_error)
from flash_dllm_jax.serve.scheduler import (Draining, EngineFailed, Event,
                                            QueueFull)
from flash_dllm_jax.serve.security import ApiKey, BodyLimit, ShutdownAnswers
from flash_dllm_jax.serve.service import Service

log = logging.getLogger("flash_dllm_jax.serve")
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
  try:
    return await asyncio.wait_for(events.get(), max(wait, 0.0)) \
        if wait is not None else await events.get()
  except asyncio.TimeoutError:
    if deadline is not None and time.monotonic() >= \
        deadline + DEADLINE_GRACE_S:
      return -1, Event("", True, "deadline")
    return None


def build_app(get_service: Callable[[], Service | None], model_name: str,
              api_key: str | None = None,
              max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
  """get_service: the Service once compiled (None while starting); api_key:
  the Bearer token every /v1 route requires (None: open)."""
  app = FastAPI(title="flash-dllm-jax")
  app.add_middleware(BodyLimit, limit=max_body_bytes)
  if api_key is not None:
    app.add_middleware(ApiKey, key=api_key)
  app.add_middleware(ShutdownAnswers)  # the outermost

  @app.exception_handler(HTTPException)
  async def _http(request, exc: HTTPException):  # unknown route, method
    return _error(exc.status_code, str(exc.detail), None, None, exc.headers)

  def service_or_503():
    service = get_service()
    if service is None:
      return None, _error(503, "the server is still compiling", None,
                          "starting", {"Retry-After": "5"})
    return service, None

  @app.get("/health")
  async def health():
    service = get_service()
    if service is None:
      return JSONResponse({"status": "starting"}, 503)
    if service.scheduler.state != "ready":  # restarting, or failed
      return JSONResponse({"status": service.scheduler.state}, 503)
    if service.scheduler.draining:
      return JSONResponse({"status": "draining"}, 503)
    return {"status": "ready", "model": model_name, **service.decoding,
            "variants": [d["options"] for d in service.decodings],
            "mesh": service.mesh,
            "attention_tiling": service.attention_tiling,
            "slots": service.settings.slots,
            "max_prompt_tokens": service.settings.max_prompt_tokens,
            "prompt_len": service.settings.prompt_len}

  @app.get("/metrics")
  async def metrics():
    service, err = service_or_503()
    if err:
      return err
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

  def model_card() -> dict:
    service = get_service()
    card = {"id": model_name, "object": "model", "created": 0,
            "owned_by": "flash-dllm-jax", "root": model_name}
    if service is not None:
      card["max_model_len"] = service.max_model_len
    return card

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [model_card()]}

  @app.get("/v1/models/{model_id:path}")
  async def model(model_id: str):
    if model_id != model_name:
      return _error(404, f"model {model_id!r} does not exist; this server "
                    f"serves {model_name!r}", "model", "model_not_found")
    return model_card()

  @app.get("/version")
  async def version():
    return {"version": tokens.version()}

  @app.post("/tokenize")
  async def tokenize(http: HttpRequest):
    service, err = service_or_503()
    if err:
      return err
    try:
      req = parse_body(await http.body(), tokens.TokenizeRequest)
      return await asyncio.to_thread(tokens.tokenize, service, req)
    except BadRequest as e:
      return _error(e.status, e.message, e.param, e.code)

  @app.post("/detokenize")
  async def detokenize(http: HttpRequest):
    service, err = service_or_503()
    if err:
      return err
    try:
      req = parse_body(await http.body(), tokens.DetokenizeRequest)
      return tokens.detokenize(service, req)
    except BadRequest as e:
      return _error(e.status, e.message, e.param, e.code)

  async def handle(model, http: HttpRequest, chat: bool):
    service, err = service_or_503()
    if err:
      return err
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    emit = lambda i, ev: loop.call_soon_threadsafe(events.put_nowait, (i, ev))
    try:
      req = parse_body(await http.body(), model)
      # tokenizing and templating take seconds for a long prompt: off the
      # event loop, so that other clients are served meanwhile
      request = await asyncio.to_thread(service.prepare, req, emit)
      if request[0].grammar is not None:  # decoded alone (structured.py)
        service.scheduler.check_open()
        threading.Thread(target=_structured, args=(service, request),
                         daemon=True).start()
      else:
        service.scheduler.submit(request)
    except BadRequest as e:
      service.metrics.requests.labels("invalid").inc()
      return _error(e.status, e.message, e.param, e.code)
    except QueueFull as e:
      service.metrics.requests.labels("rejected").inc()
      return _error(429, str(e), None, "queue_full", {"Retry-After": "1"})
    except Draining as e:
      service.metrics.requests.labels("rejected").inc()
      return _error(503, str(e), None, "server_shutdown")
    except EngineFailed as e:
      service.metrics.requests.labels("rejected").inc()
      return _error(503, str(e), None, "engine_error")
    first = request[0]
    decoding = {**first.decoding, "seed": first.seed}
    if first.sampling is not None:
      decoding["sampling"] = dataclasses.asdict(first.sampling)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    if req.stream:
      include_usage = (req.stream_options is None
                       or req.stream_options.include_usage)
      return StreamingResponse(
          _stream(service, request, events, rid, model_name, chat, decoding,
                  include_usage),
          media_type="text/event-stream")
    return await _whole(service, request, events, http, rid, model_name,
                        chat, decoding)

  # The bodies are parsed by parse_body, stricter than FastAPI's parsing.
  @app.post("/v1/completions")
  async def completions(http: HttpRequest):
    return await handle(P.CompletionRequest, http, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(http: HttpRequest):
    return await handle(P.ChatRequest, http, chat=True)

  return app


def _structured(service, request) -> None:
  """Decodes a response_format request's choices one after another."""
  for r in request:
    temperature = 0.0 if r.sampling is None else r.sampling.temperature
    try:
      outcome = service.structured(r.key).run(r, r.grammar, temperature)
    except Exception:  # noqa: BLE001 - the choice was answered 500
      log.exception("structured decoding failed")
      service.metrics.requests.labels("error").inc()
      return
    service.metrics.requests.labels(outcome).inc()


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


async def _whole(service, request, events, http, rid, model, chat, decoding):
  text = [[] for _ in request]
  last: dict[int, Event] = {}
  try:
    while len(last) < len(request):
      got = await _next_event(events, request[0].deadline, 0.5)
      if got is None:
        if await http.is_disconnected():
          service.scheduler.cancel(request)
          return Response(status_code=499)
        continue
      i, ev = got
      if i < 0:
        i = next(j for j in range(len(request)) if j not in last)
      text[i].append(ev.delta)
      if ev.done:
        last[i] = ev
        if ev.reason in _FAILED:
          service.scheduler.cancel(request)  # the other choices
          status, message, code = _FAILED[ev.reason]
          return _error(status, message, None, code)
  except asyncio.CancelledError:
    service.scheduler.cancel(request)
    raise
  done = [last[i] for i in range(len(request))]
  choices = []
  for i, ev in enumerate(done):
    r = request[i]
    lp = _logprobs(service, r, chat, ev.token_ids, ev.logprobs)
    if r.echo is not None:
      lp = _join(_echo_logprobs(service, r), lp)
    choices.append({"index": i, "text": (r.echo or "") + "".join(text[i]),
                    "finish_reason": ev.reason, "token_ids": ev.token_ids,
                    "logprobs": lp})
  body = P.chat_body if chat else P.completion_body
  return body(rid, model, choices, _usage(done, request), decoding)


def _top(request) -> int:
  """Alternatives asked per position (completions' logprobs N)."""
  return 0 if request.echo is None else request.top_logprobs


def _logprobs(service, request, chat, ids, logprobs, offset=0):
  """A choice's `logprobs` field (None unless asked for). A generated
  token's alternatives are not recorded: {} where some were asked for."""
  if not request.logprobs or logprobs is None:
    return None
  strings = service.token_strings(ids)
  if chat:
    return P.chat_logprobs(strings, list(logprobs))
  top = [{} for _ in ids] if _top(request) else None
  return P.completion_logprobs(strings, list(logprobs), offset, top)


def _echo_logprobs(service, request):
  """The echoed prompt's `logprobs` (prompt_logprobs.py), or None."""
  if request.prompt_logprobs is None:
    return None
  own, alternatives = request.prompt_logprobs
  k = _top(request)
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


async def _stream(service, request, events, rid, model, chat, decoding,
                  include_usage):
  chunk = ((lambda t, r=None, ids=(), i=0, lp=None: P.chat_chunk(
      rid, model, {"content": t}, r, ids, i, lp)) if chat else
           (lambda t, r=None, ids=(), i=0, lp=None: P.completion_chunk(
               rid, model, t, r, ids, i, lp)))
  offsets = [0] * len(request)  # text_offset of each choice's next token
  last: dict[int, Event] = {}
  failed = None
  try:
    if chat:
      for i in range(len(request)):
        yield _sse(P.chat_chunk(rid, model, {"role": "assistant",
                                             "content": ""}, index=i))
    for i, r in enumerate(request):
      if r.echo is not None:  # the prompt first, as vLLM streams it
        lp = _echo_logprobs(service, r)
        if lp is not None:
          offsets[i] = len("".join(lp["tokens"]))
        yield _sse(chunk(r.echo, None, (), i, lp))
    while len(last) < len(request):
      i, ev = await _next_event(events, request[0].deadline)
      if ev.reason in _FAILED:
        failed = ev
        last[i] = ev
        break
      if ev.delta or ev.new_ids:
        lp = _logprobs(service, request[i], chat, ev.new_ids,
                       ev.new_logprobs, offsets[i])
        if lp is not None and not chat:
          offsets[i] += sum(len(t) for t in lp["tokens"])
        yield _sse(chunk(ev.delta, None, ev.new_ids, i, lp))
      if ev.done:
        last[i] = ev
        yield _sse(chunk("", ev.reason, (), i))
    if failed is not None:
      service.scheduler.cancel(request)  # the other choices
      status, message, code = _FAILED[failed.reason]
      yield sse_error(message, code)
    elif include_usage:
      obj = "chat.completion.chunk" if chat else "text_completion"
      yield _sse(P.usage_chunk(rid, model, obj,
                               _usage([last[i] for i in range(len(request))],
                                      request), decoding))
    yield "data: [DONE]\n\n"
  finally:
    if len(last) < len(request) and failed is None:
      service.scheduler.cancel(request)  # the client went away
