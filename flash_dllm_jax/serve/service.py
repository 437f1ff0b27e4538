"""What the routes need: the compiled model runners, the engine core, and
the checks that turn an OpenAI request into a `Request` (or a 400,
input_processor.py)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import PROMPT_BUCKET, padded_length
from flash_dllm_jax.ops import Kernels, choice
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.serve.engine_core import EngineCore
from flash_dllm_jax.serve.input_processor import InputProcessor
from flash_dllm_jax.serve.metrics import Metrics
from flash_dllm_jax.serve.model_runner import ModelRunner
from flash_dllm_jax.serve.protocol import MAX_LOGPROBS

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
  # a call's step limit while the slots take new requests
  # (engine_core.EngineCore._dispatch)
  steps_while_admitting: int = 2
  max_queue: int = 256
  request_timeout: float = 600.0
  stop_at_eos: bool = True  # False: decode every position (benchmarks)
  kernels: Kernels | None = None  # kernel choice (generate(kernels=))
  slot_plan: dict | None = None  # memory_plan.SlotPlan.as_dict(): /health
  # the draw settings of a request that sets none, for a strategy that
  # samples per row (serve --temperature/--top-p/--top-k); None: greedy
  sampling: Sampling | None = None
  # alternatives per token a request may ask for (--max-logprobs, vLLM's
  # flag); a strategy that records them compiles that program at start
  max_logprobs: int = MAX_LOGPROBS

  def __post_init__(self):
    for name in ("slots", "max_prompt_tokens", "steps_per_call",
                 "steps_while_admitting", "max_queue"):
      value = getattr(self, name)  # the compiled loop holds them as int32
      if not (isinstance(value, int) and 1 <= value < 2**31):
        raise ValueError(f"{name} must be an int in [1, 2**31), got {value}")
    if isinstance(self.max_logprobs, bool) or not (
        isinstance(self.max_logprobs, int)
        and 0 <= self.max_logprobs <= MAX_LOGPROBS):
      raise ValueError(f"max_logprobs (--max-logprobs) must be an int in "
                       f"[0, {MAX_LOGPROBS}], got {self.max_logprobs}")
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


def freeze_heap() -> None:
  """Once the engines are compiled: collects, then moves every object
  alive (modules, weights' Python side, compiled programs) to the
  collector's permanent generation, so the full collections that serving's
  garbage triggers skip them (one took ~120 ms, the GIL held, on a CPU
  host)."""
  gc.collect()
  gc.freeze()


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


class Service(InputProcessor):
  """Compiles one ModelRunner per variant (one slot pool for every prompt
  length), then runs the engine core.

  sampler: the server's sampler (variant 0, what a request that states no
  option gets); variants: further samplers of the same strategy declared at
  start; a request picks one by stating options equal to its values.
  mesh: a jax Mesh every runner splits its slots (data) and weights
  (model) over, or None. on_fatal: called once the engine failed for good
  (engine_core.py)."""

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
      engines[i] = ModelRunner(params, config, v,
                               prompt_len=settings.prompt_len,
                               slots=settings.slots,
                               steps_per_call=settings.steps_per_call,
                               stop_at_eos=settings.stop_at_eos, mesh=mesh,
                               implementation=settings.kernels,
                               top_logprobs=settings.max_logprobs)
      log.info("compiled variant %d (%d slots of %d prompt positions) in "
               "%.1f s", i, settings.slots, settings.prompt_len,
               time.perf_counter() - t0)
    self.mode = "continuous" if engines[0].continuous else "batch"
    self.engine_core = EngineCore(engines, self.metrics, settings.max_queue,
                                  on_fatal, settings.steps_while_admitting)
    self.decodings = [{"strategy": settings.strategy,
                       "gen_length": v.gen_length, "steps": v.num_steps,
                       "batching": self.mode, "variant": i,
                       "options": dataclasses.asdict(v)}
                      for i, v in enumerate(self.samplers)]
    self.decoding = self.decodings[0]
    self.mesh = None if mesh is None else dict(mesh.shape)
    self.attention_tiling = dataclasses.asdict(choice.tiling(settings.kernels))
    self.engine_core.start()
