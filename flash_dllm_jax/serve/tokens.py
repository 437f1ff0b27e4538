"""vLLM's tokenizer routes: POST /tokenize ({prompt} or {messages} -> ids),
POST /detokenize (ids -> text), and GET /version."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field

from flash_dllm_jax.serve import openai_fields
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve.protocol import STRICT, ChatMessage, ChatRequest


class TokenizeRequest(BaseModel):
  """prompt (as the completions route tokenizes it) or messages (templated
  as the chat route does, add_generation_prompt by default)."""
  model_config = STRICT
  model: str | None = None
  prompt: str | None = None
  messages: list[ChatMessage] | None = Field(None, min_length=1)
  add_generation_prompt: bool = True
  add_special_tokens: bool = False
  return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
  model_config = STRICT
  model: str | None = None
  tokens: list[int]


def version() -> str:
  try:
    return metadata.version("flash-dllm-jax")
  except metadata.PackageNotFoundError:
    return "unknown"


def _check(service, model: str | None) -> None:
  if service.tokenizer is None:
    raise BadRequest("this checkpoint has no tokenizer", None)
  if model is not None and model != service.settings.model_name:
    raise BadRequest(f"model {model!r} does not exist; this server serves "
                     f"{service.settings.model_name!r}", "model", 404,
                     "model_not_found")


def tokenize(service, req: TokenizeRequest) -> dict[str, Any]:
  """{count, max_model_len, tokens[, token_strs]}."""
  _check(service, req.model)
  if (req.prompt is None) == (req.messages is None):
    raise BadRequest("give either prompt or messages", "prompt")
  if req.messages is not None:
    chat = ChatRequest(model=service.settings.model_name,
                       messages=req.messages)
    openai_fields.check(chat, service.config.arch)
    try:
      text = service.tokenizer.apply_chat_template(
          openai_fields.messages(chat),
          add_generation_prompt=req.add_generation_prompt)
    except ValueError as e:
      raise BadRequest(str(e), "messages") from None
  else:
    text = req.prompt
  ids = service.tokenizer.backend.encode_batch(
      [text], add_special_tokens=req.add_special_tokens)[0].ids
  out = {"count": len(ids), "max_model_len": service.max_model_len,
         "tokens": ids}
  if req.return_token_strs:
    out["token_strs"] = service.token_strings(ids)
  return out


def detokenize(service, req: DetokenizeRequest) -> dict[str, str]:
  _check(service, req.model)
  vocab = service.config.vocab_size
  for i, t in enumerate(req.tokens):
    if not 0 <= t < vocab:
      raise BadRequest(f"token id {t} at tokens[{i}] is outside [0, {vocab})",
                       "tokens")
  return {"prompt": service.tokenizer.decode(req.tokens)}
