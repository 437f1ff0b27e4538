"""A request body to its request model, or a BadRequest naming the field at
fault and why.

Stricter than `json.loads`: the body must be UTF-8 and a JSON object, its
strings valid Unicode (a `"\\ud800"` escape gives a lone surrogate, which no
tokenizer takes) and its numbers finite (Python's json takes `NaN`,
`Infinity` and `1e999`)."""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ValidationError

from flash_dllm_jax.serve.errors import BadRequest


class _NonFinite(str):
  """Stands in for a NaN / Infinity / -Infinity literal until it is found."""


def param_of(loc) -> str | None:
  """('messages', 0, 'content') -> 'messages.0.content' (a surrogate in a
  key escaped, so the error body stays valid UTF-8)."""
  parts = [str(x).encode("utf-8", "backslashreplace").decode()
           for x in loc if x != "body"]
  return ".".join(parts) or None


def _kind(obj) -> str:
  return {list: "an array", str: "a string", bool: "a boolean",
          type(None): "null"}.get(type(obj), "a number")


def _string_error(s: str, param: str | None, bad_utf8: bool) -> str | None:
  try:
    s.encode("utf-8")
    return None
  except UnicodeEncodeError as e:
    at = e.start
  c = s[at]
  if bad_utf8 and "\udc80" <= c <= "\udcff":  # an undecodable body byte
    return f"{param}: not valid UTF-8 (byte 0x{ord(c) - 0xdc00:02x})"
  return (f"{param}: lone surrogate U+{ord(c):04X} at character {at}; "
          "text must be valid Unicode")


def _check(obj: dict, bad_utf8: bool) -> None:
  """Walks the parsed body (iteratively: it may nest deeply)."""
  todo = [((), obj)]
  while todo:
    path, value = todo.pop()
    if isinstance(value, _NonFinite):
      param = param_of(path)
      raise BadRequest(f"{param}: {value} is not a number (numbers must be "
                       "finite)", param)
    if isinstance(value, str):
      if not value.isascii() and (
          why := _string_error(value, param_of(path), bad_utf8)):
        raise BadRequest(why, param_of(path))
    elif isinstance(value, float) and not math.isfinite(value):
      param = param_of(path)
      raise BadRequest(f"{param}: the number overflows a float (numbers must "
                       "be finite)", param)
    elif isinstance(value, dict):
      for key, item in value.items():
        if not key.isascii() and (
            why := _string_error(key, param_of(path + (key,)), bad_utf8)):
          raise BadRequest(why + " (in a key)", param_of(path + (key,)))
        todo.append((path + (key,), item))
    elif isinstance(value, list):
      # a prompt's token ids: ints need no check
      todo.extend((path + (i,), item) for i, item in enumerate(value)
                  if type(item) is not int)


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
  """raw: the request's body -> a validated `model`, or BadRequest."""
  try:
    raw.decode("utf-8")
    utf8_error = None
  except UnicodeDecodeError as e:
    utf8_error = e
  try:
    obj = json.loads(raw.decode("utf-8", "surrogateescape"),
                     parse_constant=_NonFinite)
  except json.JSONDecodeError as e:
    if utf8_error is not None:
      e = utf8_error
      raise BadRequest(f"the body is not valid UTF-8: {e.reason} (byte "
                       f"0x{e.object[e.start]:02x} at offset {e.start})",
                       "body") from None
    raise BadRequest(f"malformed JSON: {e}", "body") from None
  except (ValueError, RecursionError) as e:  # a 5000-digit integer, say
    raise BadRequest(f"malformed JSON: {e}",
                     "body") from None
  if not isinstance(obj, dict):
    raise BadRequest(f"the body must be a JSON object, got {_kind(obj)}",
                     "body")
  _check(obj, utf8_error is not None)
  try:
    return model.model_validate(obj)
  except ValidationError as e:
    err = e.errors()[0]
    param = param_of(err.get("loc", ()))
    raise BadRequest(f"{param}: {err.get('msg')}", param) from None
