"""OpenAI wire format: request models (pydantic) and response bodies.

Unknown fields are errors (extra="forbid") and types are strict, as
OpenAI's API is: a number field takes a JSON number (an int where it says
so), never a string or a boolean; a boolean field only true / false. Every
int fits the dtype it is stored in (top_k: int32, clipped to the vocabulary
by the server; seed: uint32). temperature / top_p / top_k take the ranges
of their one declaration (sampling/draw_settings.py), which the CLI flags
and the samplers check too. Responses add `decoding` (the
settings that decoded the answer, with the variant's index and each
choice's seed), `token_ids` on each choice (a stream chunk's: the answer ids
that became final with it) and `decode_steps` / `forward_passes` in `usage`
(summed over the choices). `n` choices decode as n rows with seeds seed,
seed + 1, ...; `top_k` (vLLM's extra field; 0 or -1: off) samples from the
k likeliest tokens. Two request fields go beyond OpenAI's and vLLM's:
  decoding: {option: value} of the strategy's sampler options. The server
    compiles its sampler variants at start (`--variant`); the request is
    decoded by the first variant whose options equal these (none stated:
    the server's own flags), else 400. temperature / top_p / top_k are the
    row's own data, never a variant: each request's settings decode in the
    one compiled program, with each strategy's own sampling rules (LLaDA
    takes temperature only; Dream, LLaDA2, Flash-dLLM, Fast-dLLM,
    Elastic-Cache and llada2-flash all three). A field a request leaves out
    takes the variant's sampler option (the strategy's --temperature,
    --top-p, --top-k; greedy where it has none). The numeric rule options
    decoding.threshold / decoding.factor / decoding.gamma are the row's own
    data too wherever the sampler has them (sampling/row_options.py:
    Flash-dLLM, Fast-dLLM, Elastic-Cache, llada2-flash,
    diffusion-gemma-flash, and LLaDA2's confidence threshold), never a
    variant; a value for a rule the variant
    does not run is a 400. DiffusionGemma's canvas options (all but
    canvas_length and max_denoising_steps) are the row's own data too; its
    `temperature` sets max_temperature and its `max_tokens` the row's
    max_out_length (docs/diffusion-gemma-serving.md).
  timeout: seconds until the request fails with 504 (default: the server's
    --request-timeout).

Fields OpenAI and vLLM clients send by default are taken with vLLM's
meaning where the sampler can give it (serve/openai_fields.py says which
and how): no `seed` draws a fresh one per request, reported as
`decoding.seed` (choice j of a prompt decoded with seed + j), so sending
it back reproduces the answer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flash_dllm_jax.sampling.draw_settings import TEMPERATURE, TOP_K, TOP_P
from flash_dllm_jax.serve import MAX_LOGPROBS

MAX_N = 16  # choices per request


STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
  model_config = STRICT
  include_usage: bool = True


class ResponseFormat(BaseModel):
  """OpenAI's response_format: text, json_object, or json_schema with
  {name, schema, strict, description} (serve/structured.py)."""
  model_config = STRICT
  type: Literal["text", "json_object", "json_schema"]
  json_schema: dict[str, Any] | None = None


class _Common(BaseModel):
  model_config = STRICT
  model: str
  max_tokens: int | None = Field(None, ge=1)
  # ranges: the one declaration (sampling/draw_settings.py)
  temperature: float | None = Field(None, **TEMPERATURE.bounds())
  top_p: float | None = Field(None, **TOP_P.bounds())
  top_k: int | None = Field(None, **TOP_K.bounds())
  seed: int | None = Field(None, ge=0, lt=2**32)
  stop: str | list[str] | None = None
  stream: bool = False
  stream_options: StreamOptions | None = None
  n: int = Field(1, ge=1, le=MAX_N)
  user: str | None = None
  decoding: dict[str, Any] | None = None
  timeout: float | None = Field(None, gt=0, le=3600)
  presence_penalty: float | None = Field(None, ge=-2, le=2)
  frequency_penalty: float | None = Field(None, ge=-2, le=2)
  repetition_penalty: float | None = Field(None, gt=0)  # vLLM's; 1: off
  metadata: dict[str, str] | None = None
  response_format: ResponseFormat | None = None

  def stop_list(self) -> list[str]:
    if self.stop is None:
      return []
    stops = [self.stop] if isinstance(self.stop, str) else self.stop
    return stops


class CompletionRequest(_Common):
  prompt: str | list[int] | list[str] | list[list[int]]
  echo: bool = False
  logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
  best_of: int | None = Field(None, ge=1, le=MAX_N)
  suffix: str | None = None


class ContentPart(BaseModel):
  """A part of a message's content: {"type": "text", "text": ...}; other
  types (image_url, input_audio, ...) parse, and the server refuses them."""
  model_config = ConfigDict(extra="allow", strict=True)
  type: str
  text: str | None = None


class ChatMessage(BaseModel):
  model_config = STRICT
  role: Literal["system", "developer", "user", "assistant"]
  content: str | list[ContentPart]
  name: str | None = None


class ChatRequest(_Common):
  messages: list[ChatMessage] = Field(min_length=1)
  max_completion_tokens: int | None = Field(None, ge=1)
  logprobs: bool = False
  top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


def error_body(message: str, param: str | None = None,
               type_: str = "invalid_request_error",
               code: str | None = None) -> dict:
  return {"error": {"message": message, "type": type_, "param": param,
                    "code": code}}


def new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex}"


def completion_logprobs(tokens: list[str], logprobs: list, offset: int = 0,
                        top: list | None = None) -> dict:
  """A completion choice's `logprobs`: each token's own log-probability
  (None for an echoed prompt's first token); top: each position's
  {token: log-prob} alternatives (None: not asked for); text_offset counts
  from `offset`."""
  offsets, at = [], offset
  for t in tokens:
    offsets.append(at)
    at += len(t)
  return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top,
          "text_offset": offsets}


def chat_logprobs(tokens: list[str], logprobs: list[float],
                  top: list | None = None) -> dict:
  """A chat choice's `logprobs`; top: each token's [(text, log-prob)]
  alternatives, likeliest first (None: none asked)."""
  entry = lambda t, lp: {"token": t, "logprob": lp,
                         "bytes": list(t.encode("utf-8", "replace"))}
  return {"content": [
      {**entry(t, lp), "top_logprobs": [entry(*a) for a in alt]}
      for t, lp, alt in zip(tokens, logprobs, top or [[]] * len(tokens))]}


def completion_body(rid: str, model: str, choices: list[dict], usage: dict,
                    decoding: dict) -> dict:
  """choices: {index, text, finish_reason, token_ids, logprobs} each."""
  return {"id": rid, "object": "text_completion", "created": int(time.time()),
          "model": model, "decoding": decoding,
          "choices": [{"index": c["index"], "text": c["text"],
                       "finish_reason": c["finish_reason"],
                       "logprobs": c.get("logprobs"),
                       "token_ids": c["token_ids"]} for c in choices],
          "usage": usage}


def chat_body(rid: str, model: str, choices: list[dict], usage: dict,
              decoding: dict) -> dict:
  return {"id": rid, "object": "chat.completion", "created": int(time.time()),
          "model": model, "decoding": decoding,
          "choices": [{"index": c["index"],
                       "finish_reason": c["finish_reason"],
                       "logprobs": c.get("logprobs"),
                       "message": {"role": "assistant", "content": c["text"]},
                       "token_ids": c["token_ids"]} for c in choices],
          "usage": usage}


def completion_chunk(rid: str, model: str, text: str,
                     reason: str | None = None, token_ids=(),
                     index: int = 0, logprobs: dict | None = None) -> dict:
  return {"id": rid, "object": "text_completion", "created": int(time.time()),
          "model": model,
          "choices": [{"index": index, "text": text, "finish_reason": reason,
                       "logprobs": logprobs, "token_ids": list(token_ids)}]}


def chat_chunk(rid: str, model: str, delta: dict,
               reason: str | None = None, token_ids=(), index: int = 0,
               logprobs: dict | None = None) -> dict:
  return {"id": rid, "object": "chat.completion.chunk",
          "created": int(time.time()), "model": model,
          "choices": [{"index": index, "delta": delta, "finish_reason": reason,
                       "logprobs": logprobs, "token_ids": list(token_ids)}]}


def usage_chunk(rid: str, model: str, obj: str, usage: dict,
                decoding: dict) -> dict:
  return {"id": rid, "object": obj, "created": int(time.time()),
          "model": model, "choices": [], "usage": usage, "decoding": decoding}
