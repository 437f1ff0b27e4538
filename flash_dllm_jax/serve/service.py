"""What the routes need: the compiled engines, the scheduler, and the
checks that turn an OpenAI request into a `Request` (or a 400)."""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import PROMPT_BUCKET, padded_length
from flash_dllm_jax.ops import Kernels, choice
from flash_dllm_jax.serve.engine import SlotEngine
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve import openai_fields, structured, variant_choice
from flash_dllm_jax.serve.metrics import Metrics
from flash_dllm_jax.serve.prompt_logprobs import MAX_TOP, prompt_logprobs
from flash_dllm_jax.serve.protocol import ChatRequest, CompletionRequest
from flash_dllm_jax.serve.scheduler import Request, Scheduler
from flash_dllm_jax.sampling import row_options
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.serve.text import AnswerText

log = logging.getLogger("flash_dllm_jax.serve")


@dataclasses.dataclass(frozen=True)
class Settings:
  """Server settings. slots: rows of the one slot pool every prompt length
  shares; max_prompt_tokens: the longest prompt served; the pool's rows
  hold prompt_len (it rounded up to PROMPT_BUCKET) prompt positions.
  stop_at_eos=False decodes every position, as `generate(stop_at_eos=False)`
  does (answers are still cut at the first stop token)."""

  model_name: str
  strategy: str
  slots: int = 8
  max_prompt_tokens: int = 128
  steps_per_call: int = 8
  max_queue: int = 256
  request_timeout: float = 600.0
  stop_at_eos: bool = True  # False: decode every position (benchmarks)
  kernels: Kernels | None = None  # kernel choice (generate(kernels=))
  slot_plan: dict | None = None  # memory_plan.SlotPlan.as_dict(): /health

  def __post_init__(self):
    for name in ("slots", "max_prompt_tokens", "steps_per_call", "max_queue"):
      value = getattr(self, name)  # the compiled loop holds them as int32
      if not (isinstance(value, int) and 1 <= value < 2**31):
        raise ValueError(f"{name} must be an int in [1, 2**31), got {value}")
    if not (math.isfinite(self.request_timeout)
            and self.request_timeout > 0):
      raise ValueError(f"request_timeout must be > 0, got "
                       f"{self.request_timeout}")

  @property
  def prompt_len(self) -> int:
    """Prompt positions of a slot: a multiple of PROMPT_BUCKET, so a prompt
    left-padded to it decodes as offline `generate` pads it (see
    prompts.left_pad)."""
    return padded_length(self.max_prompt_tokens, PROMPT_BUCKET)


def check_pool(settings: Settings, sampler, config: ModelConfig) -> None:
  """A ValueError unless a slot (prompt_len prompt positions + the
  sampler's canvas) fits the model's context (the CLI checks it before it
  binds the port; Service again)."""
  p, room = settings.prompt_len, config.max_seq_len - sampler.gen_length
  if p > room:
    top = room // PROMPT_BUCKET * PROMPT_BUCKET
    raise ValueError(
        f"max_prompt_tokens {settings.max_prompt_tokens}: slots hold "
        f"prompts padded to a multiple of {PROMPT_BUCKET} ({p}), and {p} + "
        f"gen_length {sampler.gen_length} exceeds max_seq_len "
        f"{config.max_seq_len}; at most {top} fits")
  sampler.check_prompt(p, config.max_seq_len)


class Service:
  """Compiles one SlotEngine per variant (one slot pool for every prompt
  length), then runs the scheduler.

  sampler: the server's sampler (variant 0, what a request that states no
  option gets); variants: further samplers of the same strategy declared at
  start; a request picks one by stating options equal to its values.
  mesh: a jax Mesh every engine splits its slots (data) and weights (model)
  over, or None. on_fatal: called once the engine failed for good
  (scheduler.py)."""

  def __init__(self, params, config: ModelConfig, tokenizer, sampler,
               settings: Settings, variants=(), mesh=None, on_fatal=None):
    self.config, self.tokenizer = config, tokenizer
    self.params = params  # for prompt log-probabilities (echo)
    self._structured = {}  # variant -> structured.Structured
    self.samplers = (sampler, *variants)
    self.sampler = sampler
    self.settings, self.metrics = settings, Metrics()
    for v in self.samplers:
      if type(v) is not type(sampler):
        raise ValueError(f"variant {v!r} is not a {type(sampler).__name__}")
      check_pool(settings, v, config)
    if len(set(self.samplers)) < len(self.samplers):
      raise ValueError("two declared variants decode with the same options")
    engines = {}
    for i, v in enumerate(self.samplers):
      t0 = time.perf_counter()
      engines[i] = SlotEngine(params, config, v,
                              prompt_len=settings.prompt_len,
                              slots=settings.slots,
                              steps_per_call=settings.steps_per_call,
                              stop_at_eos=settings.stop_at_eos, mesh=mesh,
                              implementation=settings.kernels)
      log.info("compiled variant %d (%d slots of %d prompt positions) in "
               "%.1f s", i, settings.slots, settings.prompt_len,
               time.perf_counter() - t0)
    self.mode = "continuous" if engines[0].continuous else "batch"
    self.scheduler = Scheduler(engines, self.metrics, settings.max_queue,
                               on_fatal)
    self.decodings = [{"strategy": settings.strategy,
                       "gen_length": v.gen_length, "steps": v.num_steps,
                       "batching": self.mode, "variant": i,
                       "options": dataclasses.asdict(v)}
                      for i, v in enumerate(self.samplers)]
    self.decoding = self.decodings[0]
    self.mesh = None if mesh is None else dict(mesh.shape)
    self.attention_tiling = dataclasses.asdict(choice.tiling(settings.kernels))
    self.scheduler.start()

  # Request checks ---------------------------------------------------------
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

  def _logprobs(self, req) -> bool:
    """Whether `req` asks for log-probabilities; BadRequest for what the
    server cannot give (alternatives, or a sampler that reports none)."""
    if isinstance(req, ChatRequest):
      want, top, param = req.logprobs, req.top_logprobs or 0, "top_logprobs"
    else:
      want, top, param = req.logprobs is not None, req.logprobs or 0, \
          "logprobs"
    if top and not getattr(req, "echo", False):
      raise BadRequest(f"{param} {top}: alternatives are given for the "
                       "prompt's tokens (echo) only; a generated token "
                       "has its own log-probability (ask for 0)", param)
    if top > MAX_TOP:
      raise BadRequest(f"{param} {top}: at most {MAX_TOP}", param)
    if want and not (self.row_data
                     or getattr(self.sampler, "reports_logprobs", False)):
      raise BadRequest(f"strategy {self.settings.strategy!r} does not report "
                       "log-probabilities", "logprobs")
    if want and getattr(req, "echo", False):
      self._needs_engine_model("an echoed prompt's logprobs", "logprobs")
    return want

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
    want_logprobs = self._logprobs(req)
    stops = req.stop_list()
    if len(stops) > 4 or any(not s for s in stops):
      raise BadRequest("stop takes at most 4 non-empty strings", "stop")
    sampling = None
    if self.row_data:
      own = getattr(sampler, "own_sampling", Sampling)()
      sampling = Sampling(
          temperature=float(own.temperature if req.temperature is None
                            else req.temperature),
          top_p=float(own.top_p if req.top_p is None else req.top_p),
          top_k=own.top_k if req.top_k is None else  # k >= V: all
          min(max(0, req.top_k), self.config.vocab_size),
          **variant_choice.row_values(req, sampler))
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
            prompt_logprobs=scored, grammar=grammar, top_logprobs=(
                req.logprobs or 0) if echo else 0))
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
