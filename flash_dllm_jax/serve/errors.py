"""Errors in OpenAI's format: `{"error": {"message", "type", "param",
"code"}}`, type `invalid_request_error` below 500, `server_error` from it."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from flash_dllm_jax.serve.protocol import error_body


class BadRequest(Exception):
  """An invalid request: HTTP status, message and the field it names."""

  def __init__(self, message: str, param: str | None, status: int = 400,
               code: str | None = None):
    super().__init__(message)
    self.message, self.param, self.status, self.code = (message, param,
                                                        status, code)


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers=None) -> JSONResponse:
  type_ = "invalid_request_error" if status < 500 else "server_error"
  return JSONResponse(error_body(message, param, type_, code), status,
                      headers=headers)


def sse_error(message: str, code: str) -> str:
  """A stream's error event (a server error after the 200 went out)."""
  body = error_body(message, None, "server_error", code)
  return f"data: {json.dumps(body)}\n\n"
