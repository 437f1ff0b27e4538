"""Turns an OpenAI request into the engine core's `Request`s, or a 400
naming the field at fault (vLLM's input processor): tokenizing, the
prompt and field checks, the variant, sampling and log-probabilities a
request gets."""

from __future__ import annotations

import secrets
import time

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.serve import openai_fields, structured, variant_choice
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve.events import Request
from flash_dllm_jax.serve.prompt_logprobs import prompt_logprobs
from flash_dllm_jax.serve.protocol import (MAX_LOGPROBS, ChatRequest,
                                           CompletionRequest)
from flash_dllm_jax.sampling import row_options
from flash_dllm_jax.sampling.loop import records_top
from flash_dllm_jax.sampling.row_sampling import Sampling, row_fields
from flash_dllm_jax.serve.text import AnswerText


class InputProcessor:
  """The request checks of `service.Service` (which holds config,
  tokenizer, params, settings, samplers, decodings and metrics)."""

  def _encode(self, text: str) -> list[int]:
    """tokenizer.encode's ids; through encode_batch, which lets go of the
    GIL (encode holds it), so the event loop runs meanwhile."""
    return self.tokenizer.backend.encode_batch(
        [text], add_special_tokens=False)[0].ids

  @property
  def max_model_len(self) -> int:
    """The longest prompt plus the longest answer a request can get."""
    return self.settings.max_prompt_tokens + max(v.gen_length
                                                 for v in self.samplers)

  def _prompt_ids(self, req) -> list[list[int]]:
    """Each prompt's ids (a chat request: one)."""
    if isinstance(req, ChatRequest):
      return [self._chat_ids(req)]
    return [self._completion_ids(p) for p in openai_fields.prompts(req)]

  def _chat_ids(self, req) -> list[int]:
    if self.tokenizer is None:
      raise BadRequest("this checkpoint has no tokenizer", "messages")
    try:
      text = self.tokenizer.apply_chat_template(openai_fields.messages(req),
                                                add_generation_prompt=True)
    except ValueError as e:
      raise BadRequest(str(e), "messages") from None
    return self._encode(text)

  def _completion_ids(self, prompt) -> list[int]:
    if isinstance(prompt, str):
      if self.tokenizer is None:
        raise BadRequest("text prompts need a tokenizer; send token ids",
                         "prompt")
      return self._encode(prompt)
    return list(prompt)

  @property
  def row_data(self) -> bool:
    """The sampler takes row data (`row_fields`; else sampler options)."""
    return row_options.takes_rows(self.sampler)

  def _logprobs(self, req) -> tuple[bool, int]:
    """(whether `req` asks for log-probabilities, the alternatives it asks
    per token); BadRequest for what the server cannot give (a sampler that
    reports none, or alternatives of generated tokens from one that records
    none: then only an echoed prompt's have them)."""
    if isinstance(req, ChatRequest):
      want, top, param = req.logprobs, req.top_logprobs or 0, "top_logprobs"
    else:
      want, top, param = req.logprobs is not None, req.logprobs or 0, \
          "logprobs"
    if top > MAX_LOGPROBS:
      raise BadRequest(f"{param} {top}: at most {MAX_LOGPROBS}", param)
    if top > self.settings.max_logprobs:
      raise BadRequest(f"{param} {top}: this server gives at most "
                       f"{self.settings.max_logprobs} (--max-logprobs)", param)
    if want and not (self.row_data
                     or getattr(self.sampler, "reports_logprobs", False)):
      raise BadRequest(f"strategy {self.settings.strategy!r} does not report "
                       "log-probabilities", "logprobs")
    if want and getattr(req, "echo", False):
      self._needs_engine_model("an echoed prompt's logprobs", "logprobs")
    if top and not getattr(req, "echo", False) and not records_top(
        self.sampler):
      raise BadRequest(f"{param} {top}: strategy "
                       f"{self.settings.strategy!r} records no alternatives "
                       "of generated tokens; they are given for an echoed "
                       "prompt's tokens only (ask for 0)", param)
    return want, top if want else 0

  def _needs_engine_model(self, what: str, param: str) -> None:
    """BadRequest where the family runs its own model (not ModelConfig's
    forward, which prompt scoring and structured decoding run)."""
    if not isinstance(self.config, ModelConfig):
      raise BadRequest(f"{what} is not supported for the "
                       f"{self.config.arch} family", param)

  def token_strings(self, ids) -> list[str]:
    """Each id's own text (vLLM's 'token_id:N' without a tokenizer)."""
    if self.tokenizer is None:
      return [f"token_id:{i}" for i in ids]
    return [self.tokenizer.decode([i]) for i in ids]

  def prepare(self, req: CompletionRequest | ChatRequest,
              emit) -> list[Request]:
    """The Requests for `req`'s n choices (emit(index, event) answers them),
    or BadRequest naming the field at fault. Runs in a worker thread (it
    tokenizes)."""
    with self.metrics.preparing.track_inprogress():
      return self._prepare(req, emit)

  def _prepare(self, req, emit) -> list[Request]:
    if req.model != self.settings.model_name:
      raise BadRequest(f"model {req.model!r} does not exist; this server "
                       f"serves {self.settings.model_name!r}", "model", 404,
                       "model_not_found")
    openai_fields.check(req, self.config.arch)
    every = self._prompt_ids(req)
    many = len(every) > 1
    if not every:
      raise BadRequest("the prompt list is empty", "prompt")
    if len(every) * req.n > self.settings.max_queue:
      raise BadRequest(f"{len(every)} prompts of {req.n} choices each "
                       f"exceed the server's queue of "
                       f"{self.settings.max_queue}", "prompt")
    for p, ids in enumerate(every):
      self._check_ids(req, ids, f"prompt.{p}" if many else None)
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
      max_tokens = req.max_completion_tokens
    variant = variant_choice.pick(req, self.samplers,
                                  self.settings.strategy)
    sampler = self.samplers[variant]
    if max_tokens is not None and max_tokens > sampler.gen_length:
      raise BadRequest(f"max_tokens {max_tokens} exceeds the gen_length "
                       f"{sampler.gen_length} of variant {variant}",
                       "max_tokens")
    want_logprobs, top = self._logprobs(req)
    stops = req.stop_list()
    if len(stops) > 4 or any(not s for s in stops):
      raise BadRequest("stop takes at most 4 non-empty strings", "stop")
    sampling = None
    if self.row_data:
      own = (sampler.own_sampling() if hasattr(sampler, "own_sampling")
             else self.settings.sampling or Sampling())
      draws = dict(
          temperature=float(own.temperature if req.temperature is None
                            else req.temperature),
          top_p=float(own.top_p if req.top_p is None else req.top_p),
          top_k=own.top_k if req.top_k is None else  # k >= V: all
          min(max(0, req.top_k), self.config.vocab_size))
      sampling = Sampling(  # the draws the sampler takes per row
          **{k: v for k, v in draws.items() if k in row_fields(sampler)},
          **variant_choice.row_values(req, sampler, max_tokens))
    timeout = req.timeout or self.settings.request_timeout
    deadline = time.monotonic() + timeout
    grammar = structured.grammar(req.response_format)
    if grammar is not None:
      self._needs_engine_model("response_format", "response_format")
      if req.stream:
        raise BadRequest("response_format with stream is not supported",
                         "stream")
      if want_logprobs:
        raise BadRequest("logprobs with response_format are not supported "
                         "(the grammar's forced tokens have none)",
                         "logprobs")
      self.structured(variant).check(grammar)
    # no seed: a fresh one, reported in `decoding.seed` (protocol.py)
    seed = secrets.randbits(32) if req.seed is None else req.seed
    echo = isinstance(req, CompletionRequest) and req.echo
    edit_block = sampler.block_length if getattr(
        sampler, "editing_threshold", None) is not None else None
    out = []
    for p, ids in enumerate(every):
      shown = (self.tokenizer.decode(ids) if self.tokenizer is not None
               else "") if echo else None
      scored = self._prompt_logprobs(ids, sampler) if echo and \
          want_logprobs else None
      for j in range(req.n):
        i = p * req.n + j
        out.append(Request(
            ids=ids, key=variant, seed=(seed + j) % 2**32,
            answer=AnswerText(self.tokenizer, self.config,
                              max_tokens or sampler.gen_length, stops,
                              edit_block, len(ids)),
            emit=lambda ev, i=i: emit(i, ev), deadline=deadline,
            decoding=self.decodings[variant], sampling=sampling,
            index=i, logprobs=want_logprobs, echo=shown,
            prompt_logprobs=scored, grammar=grammar, top_logprobs=top))
    return out

  def structured(self, variant: int) -> structured.Structured:
    """The grammar-constrained decoder of a variant's canvas."""
    if variant not in self._structured:
      sampler = self.samplers[variant]
      self._structured[variant] = structured.Structured(
          self.params, self.config, self.tokenizer, sampler.gen_length,
          self._blocks(sampler))
    return self._structured[variant]

  def _blocks(self, sampler) -> int | None:
    return (getattr(sampler, "block_length", None)
            if self.config.spec.attention.mask == "block_causal" else None)

  def _prompt_logprobs(self, ids, sampler):
    """prompt_logprobs.prompt_logprobs of `ids` (block-causal families:
    in the sampler's blocks)."""
    return prompt_logprobs(self.params, self.config, ids,
                           self._blocks(sampler))

  def _check_ids(self, req, ids, where: str | None) -> None:
    """BadRequest unless `ids` is a prompt the slots take."""
    field = where or ("messages" if isinstance(req, ChatRequest)
                      else "prompt")
    if not ids:
      raise BadRequest("the prompt is empty", field)
    if len(ids) > self.settings.max_prompt_tokens:
      raise BadRequest(f"the prompt has {len(ids)} tokens; this server takes "
                       f"at most {self.settings.max_prompt_tokens}", field)
    for i, t in enumerate(ids):
      if not 0 <= t < self.config.vocab_size:
        raise BadRequest(f"token id {t} at {field}[{i}] is outside "
                         f"[0, {self.config.vocab_size})", field)
    if self.config.mask_token_id in ids:
      raise BadRequest(f"the prompt contains the mask token (id "
                       f"{self.config.mask_token_id}) at position "
                       f"{ids.index(self.config.mask_token_id)}", field)
