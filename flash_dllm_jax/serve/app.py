"""FastAPI routes: /v1/completions, /v1/chat/completions (JSON or SSE),
/v1/models, /health and /metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from flash_dllm_jax.serve import protocol as P
from flash_dllm_jax.serve.scheduler import Draining, Event, QueueFull
from flash_dllm_jax.serve.service import BadRequest, Service

_FAILED = {"deadline": (504, "the request's deadline passed", "timeout"),
           "shutdown": (503, "the server shut down before answering",
                        "server_shutdown"),
           "error": (500, "the decoding engine failed", "engine_error")}


def _error(status: int, message: str, param=None, code=None,
           headers=None) -> JSONResponse:
  type_ = "invalid_request_error" if status < 500 else "server_error"
  return JSONResponse(P.error_body(message, param, type_, code), status,
                      headers=headers)


def _param(loc) -> str | None:
  parts = [str(x) for x in loc if x != "body"]
  return ".".join(parts) or None


def build_app(get_service: Callable[[], Service | None],
              model_name: str) -> FastAPI:
  """get_service: the Service once compiled (None while starting)."""
  app = FastAPI(title="flash-dllm-jax")

  @app.exception_handler(RequestValidationError)
  async def _invalid(request, exc: RequestValidationError):
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
      return _error(400, f"malformed JSON: {err.get('ctx', {}).get('error')}",
                    "body")
    param = _param(err.get("loc", ()))
    return _error(400, f"{param}: {err.get('msg')}", param)

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
    if service.scheduler.draining:
      return JSONResponse({"status": "draining"}, 503)
    return {"status": "ready", "model": model_name, **service.decoding,
            "variants": [d["options"] for d in service.decodings],
            "mesh": service.mesh,
            "attention_tiling": service.attention_tiling,
            "slots_per_bucket": service.settings.slots,
            "prompt_buckets": list(service.settings.buckets)}

  @app.get("/metrics")
  async def metrics():
    service, err = service_or_503()
    if err:
      return err
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": model_name, "object": "model",
                                        "created": 0,
                                        "owned_by": "flash-dllm-jax"}]}

  async def handle(req, http: HttpRequest, chat: bool):
    service, err = service_or_503()
    if err:
      return err
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()
    emit = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
    try:
      request = service.prepare(req, emit)
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
    decoding = {**request.decoding, "seed": request.seed}
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

  @app.post("/v1/completions")
  async def completions(req: P.CompletionRequest, http: HttpRequest):
    return await handle(req, http, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(req: P.ChatRequest, http: HttpRequest):
    return await handle(req, http, chat=True)

  return app


async def _whole(service, request, events, http, rid, model, chat, decoding):
  text = []
  try:
    while True:
      try:
        ev = await asyncio.wait_for(events.get(), 0.5)
      except asyncio.TimeoutError:
        if await http.is_disconnected():
          service.scheduler.cancel(request)
          return Response(status_code=499)
        continue
      text.append(ev.delta)
      if ev.done:
        break
  except asyncio.CancelledError:
    service.scheduler.cancel(request)
    raise
  if ev.reason in _FAILED:
    status, message, code = _FAILED[ev.reason]
    return _error(status, message, None, code)
  body = P.chat_body if chat else P.completion_body
  return body(rid, model, "".join(text), ev.reason, ev.token_ids, ev.usage,
              decoding)


def _sse(obj) -> str:
  return f"data: {json.dumps(obj)}\n\n"


async def _stream(service, request, events, rid, model, chat, decoding,
                  include_usage):
  chunk = ((lambda t, r=None, ids=(): P.chat_chunk(rid, model,
                                                   {"content": t}, r, ids))
           if chat else
           (lambda t, r=None, ids=(): P.completion_chunk(rid, model, t, r,
                                                         ids)))
  done = False
  try:
    if chat:
      yield _sse(P.chat_chunk(rid, model, {"role": "assistant",
                                           "content": ""}))
    while True:
      ev = await events.get()
      if ev.delta or ev.new_ids:
        yield _sse(chunk(ev.delta, None, ev.new_ids))
      if ev.done:
        done = True
        break
    if ev.reason in _FAILED:
      status, message, code = _FAILED[ev.reason]
      yield _sse(P.error_body(message, None, "server_error", code))
    else:
      yield _sse(chunk("", ev.reason))
      if include_usage:
        obj = "chat.completion.chunk" if chat else "text_completion"
        yield _sse(P.usage_chunk(rid, model, obj, ev.usage, decoding))
    yield "data: [DONE]\n\n"
  finally:
    if not done:  # the client went away (or the server is stopping)
      service.scheduler.cancel(request)
