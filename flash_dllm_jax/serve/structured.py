"""JSON mode and JSON schemas (`response_format`): decoding under a grammar
mask from llguidance (PyPI; it reads the checkpoint's `tokenizers` JSON and
runs on the host, on CPU and beside any accelerator).

A diffusion sampler may commit any position first, but a grammar mask is
only defined for the next token after a committed prefix: a token placed
further right is only safe if some completion of everything between stays
valid, which the mask cannot tell. So a structured request commits left to
right. The tokens the grammar forces (llguidance `compute_ff_tokens`: the
schema's keys and punctuation) are committed without a forward; otherwise a
step runs one forward over prompt + canvas (no cache), and
  1. the leftmost uncommitted position takes a token from its distribution
     under the grammar's mask (argmax, or sampled at the request's
     temperature from the row's own seed);
  2. the positions after it whose own proposal (argmax of the same forward)
     is confident (probability >= `threshold`) take it too, as long as the
     grammar accepts each in turn (llguidance `validate_tokens`) -- the
     parallel commit of threshold decoding, kept only where it stays valid.
So every committed token extends a prefix the grammar accepts. Log-probs
are not reported for such requests (forced tokens have none). The mask is
computed on the host each step (one bitmask per forward, under a
millisecond for a JSON schema: `host_s` / `steps` count it) and one
vocabulary row comes back from the device per step. Such a request decodes
alone, outside the slot pool (requests with a grammar wait for each other).
"""

from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.compilation import _BatchInvariantJit
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import padded_length
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve.events import Event

THRESHOLD = 0.9  # the confidence a later position's proposal needs
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ",
               "key_separator": ": "}


def grammar(response_format) -> str | None:
  """The llguidance grammar of a request's response_format (None: text);
  BadRequest for a schema it cannot compile."""
  import llguidance
  if response_format is None or response_format.type == "text":
    return None
  if response_format.type == "json_object":
    schema = {"type": "object"}
  else:
    spec = response_format.json_schema
    if spec is None or spec.get("schema") is None:
      raise BadRequest("response_format.json_schema needs a `schema`",
                       "response_format.json_schema")
    schema = spec["schema"]
  try:
    text = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), overrides=_JSON_STYLE)
  except ValueError as e:
    raise BadRequest(f"response_format: {e}", "response_format") from None
  failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
      text)
  if failed:
    raise BadRequest(f"response_format: the schema does not compile: "
                     f"{'; '.join(messages)}", "response_format")
  return text


def _step(params, tokens_1xN, valid_1xN, rows_1xG, first, *,
          config: ModelConfig, block_length: int | None):
  """(log-probs at canvas position `first` [V], argmax [G], its
  probability [G])."""
  model = SequenceModel.for_batch(config, params, valid_1xN)
  logits = model.logits(tokens_1xN, rows_1xG, block_length).astype(
      jnp.float32)[0]
  logp_GxV = jax.nn.log_softmax(logits, axis=-1)
  return (logp_GxV[first], jnp.argmax(logp_GxV, -1),
          jnp.exp(jnp.max(logp_GxV, -1)))


_step_jit = _BatchInvariantJit(_step,
                               static_argnames=("config", "block_length"))


class Structured:
  """Grammar-constrained decoding for one server (see the module
  docstring); gen_length: the canvas; block_length: a block-causal
  family's attention blocks (None: full attention)."""

  def __init__(self, params, config: ModelConfig, tokenizer,
               gen_length: int, block_length: int | None = None,
               threshold: float = THRESHOLD):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.g, self.block, self.threshold = gen_length, block_length, threshold
    self._lock = threading.Lock()
    self._lltok = None
    self.steps = 0  # forwards run, and the host's grammar seconds in them
    self.host_s = 0.0

  def _matcher(self, text: str):
    import llguidance
    if self._lltok is None:
      self._lltok = llguidance.LLTokenizer(
          self.tokenizer.backend.to_str(), n_vocab=self.config.vocab_size,
          eos_token=list(self.config.stop_token_ids))
    m = llguidance.LLMatcher(self._lltok, text)
    if m.is_error():
      raise BadRequest(f"response_format: {m.get_error()}",
                       "response_format")
    return m

  def check(self, text: str) -> None:
    """BadRequest unless `text` builds a matcher for this tokenizer."""
    if self.tokenizer is None:
      raise BadRequest("response_format needs a tokenizer", "response_format")
    self._matcher(text)

  def decode(self, ids: list[int], text: str, max_tokens: int, seed: int,
             temperature: float, alive=lambda: True):
    """(answer ids, steps): at most max_tokens, ending
    with a stop token where the grammar completed; None if alive() turned
    false."""
    c, g = self.config, self.g
    p = padded_length(len(ids))
    tokens = np.full((1, p + g), c.mask_token_id, np.int32)
    tokens[0, :p] = c.pad_token_id
    tokens[0, p - len(ids):p] = ids
    valid = np.zeros((1, p + g), bool)
    valid[0, p - len(ids):] = True
    rows = (p + np.arange(g) - c.logits_shift)[None].astype(np.int32)
    matcher, rng = self._matcher(text), np.random.default_rng(seed)
    out, steps, stops = [], 0, set(c.stop_token_ids)
    with self._lock:
      while len(out) < max_tokens and not (out and out[-1] in stops):
        if not alive():
          return None
        if matcher.is_stopped():  # complete, nothing can follow: the end
          out.append(c.stop_token_ids[0])
          break
        t0 = time.perf_counter()
        # what the grammar forces next (keys, punctuation) needs no forward
        forced = matcher.compute_ff_tokens()[:max_tokens - len(out)]
        self.host_s += time.perf_counter() - t0
        if forced:
          if not matcher.consume_tokens(forced):
            raise RuntimeError(f"the grammar refused its forced {forced}")
          tokens[0, p + len(out):p + len(out) + len(forced)] = forced
          out += forced
          continue
        logp, best, conf = (np.asarray(x) for x in _step_jit(
            self.params, tokens, valid, rows, np.int32(len(out)), config=c,
            block_length=self.block))
        steps += 1
        t0 = time.perf_counter()
        allowed = np.unpackbits(np.frombuffer(matcher.compute_bitmask(),
                                              np.uint8),
                                bitorder="little")[:c.vocab_size].astype(bool)
        masked = np.where(allowed, logp, -np.inf)
        if temperature > 0:
          z = masked / temperature
          prob = np.exp(z - z.max())
          tok = int(rng.choice(len(prob), p=prob / prob.sum()))
        else:
          tok = int(np.argmax(masked))
        run = [tok]
        for k in range(len(out) + 1, max_tokens):
          if run[-1] in stops or conf[k] < self.threshold:
            break
          run.append(int(best[k]))
        run = run[:max(1, matcher.validate_tokens(run))]
        if not matcher.consume_tokens(run):
          raise RuntimeError(f"the grammar refused {run} it validated")
        tokens[0, p + len(out):p + len(out) + len(run)] = run
        out += run
        self.host_s += time.perf_counter() - t0
      self.steps += steps
    return out, steps

  def run(self, request, text: str, temperature: float) -> str:
    """Decodes `request` (an events.Request) and answers it through its
    emit, as the engine loop does; returns the outcome ('ok', 'deadline'
    or 'cancelled')."""
    t0 = time.monotonic()
    alive = lambda: not request.cancelled and (
        request.deadline is None or time.monotonic() < request.deadline)
    try:
      got = self.decode(request.ids, text, request.answer.max_tokens,
                        request.seed, temperature, alive)
    except Exception:  # noqa: BLE001 - answered, then logged by the caller
      request.emit(Event("", True, "error"))
      raise
    if got is None:
      if request.cancelled:
        return "cancelled"
      request.emit(Event("", True, "deadline"))
      return "deadline"
    out, steps = got
    gen = np.full(self.g, self.config.mask_token_id, np.int32)
    gen[:len(out)] = out
    progress, request.answer = request.answer.update(gen, True)
    n = len(progress.token_ids)
    usage = {"prompt_tokens": len(request.ids), "completion_tokens": n,
             "total_tokens": len(request.ids) + n, "decode_steps": steps,
             "forward_passes": steps}
    request.first_token_at = t0
    request.emit(Event(progress.delta, True, progress.reason,
                       progress.token_ids, usage, tuple(progress.new_ids)))
    return "ok"
