"""FastAPI routes: /v1/completions, /v1/chat/completions (JSON or SSE),
/v1/models (and /v1/models/{id}), /tokenize, /detokenize, /version,
/health and /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
from typing import Callable

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from flash_dllm_jax.serve import MAX_BODY_BYTES, answers, protocol as P, tokens
from flash_dllm_jax.serve.body import parse_body
from flash_dllm_jax.serve.errors import BadRequest, error_response as _error
from flash_dllm_jax.serve.engine_core import (Draining, EngineFailed, Event,
                                              QueueFull)
from flash_dllm_jax.serve.events import post
from flash_dllm_jax.serve.security import ApiKey, BodyLimit, ShutdownAnswers
from flash_dllm_jax.serve.service import Service

log = logging.getLogger("flash_dllm_jax.serve")


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
    if service.engine_core.state != "ready":  # restarting, or failed
      return JSONResponse({"status": service.engine_core.state}, 503)
    if service.engine_core.draining:
      return JSONResponse({"status": "draining"}, 503)
    return {"status": "ready", "model": model_name, **service.decoding,
            "variants": [d["options"] for d in service.decodings],
            "mesh": service.mesh,
            "attention_tiling": service.attention_tiling,
            "slots": service.settings.slots,
            "max_prompt_tokens": service.settings.max_prompt_tokens,
            "prompt_len": service.settings.prompt_len,
            "slot_plan": service.settings.slot_plan}

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
    emit = lambda i, ev: post(loop, events.put_nowait, (i, ev))
    try:
      req = parse_body(await http.body(), model)
      # tokenizing and templating take seconds for a long prompt: off the
      # event loop, so that other clients are served meanwhile
      request = await asyncio.to_thread(service.prepare, req, emit)
      if request[0].grammar is not None:  # decoded alone (structured.py)
        service.engine_core.check_open()
        threading.Thread(target=_structured, args=(service, request),
                         daemon=True).start()
      else:
        service.engine_core.add_request(request)
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
      decoding["sampling"] = _sampling_fields(first.sampling)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    if req.stream:
      include_usage = (req.stream_options is None
                       or req.stream_options.include_usage)
      return StreamingResponse(
          answers.stream(service, request, events, rid, model_name, chat, decoding,
                  include_usage),
          media_type="text/event-stream")
    return await answers.whole(service, request, events, http, rid, model_name,
                        chat, decoding)

  # The bodies are parsed by parse_body, stricter than FastAPI's parsing.
  @app.post("/v1/completions")
  async def completions(http: HttpRequest):
    return await handle(P.CompletionRequest, http, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(http: HttpRequest):
    return await handle(P.ChatRequest, http, chat=True)

  return app


def _sampling_fields(sampling) -> dict:
  """dataclasses.asdict(sampling), which walks and copies every field,
  once per value of a hashable Sampling."""
  try:
    return dict(_fields_of(sampling))
  except TypeError:  # unhashable: a list in a field
    return dataclasses.asdict(sampling)


@functools.lru_cache(maxsize=256)
def _fields_of(sampling) -> dict:
  return dataclasses.asdict(sampling)


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
