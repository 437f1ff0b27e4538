"""What guards the server: the API key, the body size limit, answers for
requests cut by a shutdown (ASGI middleware), and the request-header
timeout (uvicorn's h11 protocol, which has none of its own)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from flash_dllm_jax.serve.errors import error_response, sse_error

log = logging.getLogger("flash_dllm_jax.serve")

API_KEY_ENV = "FLASH_DLLM_JAX_API_KEY"


def is_loopback(host: str) -> bool:
  """Whether binding `host` keeps the server to this machine."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False  # a host name: assume it is reachable


class ApiKey:
  """Requires `Authorization: Bearer <key>` on every /v1 route (as vLLM
  does: /health, /metrics and OPTIONS stay open); 401 otherwise. Keys are
  compared as SHA-256 digests, in constant time."""

  def __init__(self, app, key: str):
    self.app, self.digest = app, hashlib.sha256(key.encode()).digest()

  def _ok(self, scope) -> bool:
    auth = dict(scope["headers"]).get(b"authorization", b"")
    scheme, _, token = auth.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(
        hashlib.sha256(token.strip()).digest(), self.digest)

  async def __call__(self, scope, receive, send):
    if (scope["type"] == "http" and scope["method"] != "OPTIONS"
        and scope["path"].startswith("/v1") and not self._ok(scope)):
      has = b"authorization" in dict(scope["headers"])
      message = ("incorrect API key" if has else
                 "no API key: send the header 'Authorization: Bearer <key>'")
      await error_response(401, message, None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})(scope, receive,
                                                           send)
      return
    await self.app(scope, receive, send)


class BodyLimit:
  """Answers 413 (and closes the connection) for a body over `limit` bytes:
  by its Content-Length before reading any of it, else (chunked) once the
  bytes read pass the limit. The body is read here and handed on whole."""

  def __init__(self, app, limit: int):
    self.app, self.limit = app, limit

  async def _too_large(self, scope, receive, send):
    await error_response(413, f"the request body exceeds {self.limit} bytes "
                         "(--max-body-bytes)", None, "body_too_large",
                         {"Connection": "close"})(scope, receive, send)

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and int(length) > self.limit:  # h11 checked it
      return await self._too_large(scope, receive, send)
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] != "http.request":  # the client left
        return
      chunks.append(message.get("body", b""))
      size += len(chunks[-1])
      if size > self.limit:
        return await self._too_large(scope, receive, send)
      if not message.get("more_body", False):
        break
    whole = {"type": "http.request", "body": b"".join(chunks),
             "more_body": False}

    async def replay():
      nonlocal whole
      if whole is None:
        return await receive()  # the disconnect, once the client leaves
      message, whole = whole, None
      return message

    await self.app(scope, replay, send)


class ShutdownAnswers:
  """uvicorn cancels the requests still running when its graceful shutdown
  ends: answers each 503 `server_shutdown` (or ends its stream) instead of
  uvicorn's 500 and traceback."""

  def __init__(self, app):
    self.app = app

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    started, done = None, False  # started: the response's content type

    async def watch(message):
      nonlocal started, done
      if message["type"] == "http.response.start":
        started = dict(message.get("headers", ())).get(b"content-type", b"")
      done = message["type"] == "http.response.body" and not message.get(
          "more_body", False)
      await send(message)

    try:
      await self.app(scope, receive, watch)
    except asyncio.CancelledError:
      if done:
        return
      log.warning("%s %s: cut by the shutdown; answered server_shutdown",
                  scope["method"], scope["path"])
      if started is not None:  # a stream: its error event, then the end
        tail = (sse_error("the server shut down before answering",
                          "server_shutdown") + "data: [DONE]\n\n"
                if started.startswith(b"text/event-stream") else "")
        await send({"type": "http.response.body", "body": tail.encode(),
                    "more_body": False})
      else:
        await error_response(503, "the server shut down before answering",
                             None, "server_shutdown",
                             {"Connection": "close"})(scope, receive, send)


def header_timeout_protocol(timeout: float) -> type[H11Protocol]:
  """uvicorn's h11 protocol, closing a connection whose request headers are
  not complete `timeout` seconds after it opened (or, between requests on a
  kept-alive connection, after the next request's first byte): 408 if part
  of a request came, else silence. Idle kept-alive connections are closed
  by uvicorn's own `timeout_keep_alive`."""

  class HeaderTimeout(H11Protocol):
    _header_timer = None

    def _arm(self):
      self._header_timer = self.loop.call_later(timeout, self._expire)

    def _disarm(self):
      if self._header_timer is not None:
        self._header_timer.cancel()
        self._header_timer = None

    def _expire(self):
      self._header_timer = None
      if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
        return
      if self.conn.trailing_data[0]:
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\n"
                             b"content-length: 0\r\nconnection: close\r\n\r\n")
      log.info("closed a connection from %s: no complete request headers "
               "within %g s", self.client, timeout)
      self.transport.close()

    def connection_made(self, transport):
      super().connection_made(transport)
      self._arm()

    def data_received(self, data):
      if self._header_timer is None and self.conn.their_state is h11.IDLE:
        self._arm()
      super().data_received(data)
      if self.conn.their_state is not h11.IDLE:
        self._disarm()

    def connection_lost(self, exc):
      self._disarm()
      super().connection_lost(exc)

  return HeaderTimeout
