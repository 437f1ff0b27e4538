"""DiffusionGemma's official sampler (google-deepmind/gemma, gemma/diffusion/
_sampler.py with _chat_sampler.Sampler's defaults), every row at its own
pace in one compiled loop.

A row's prompt is prefilled causally (the K/V of every prompt token kept,
as `keep_last_prefill_kv`), then canvas by canvas: C random ids, up to
`max_denoising_steps` self-conditioned denoising steps (annealed
temperature, entropy-bound acceptance, renoising; sampler_steps.py) until
the early-stop rule fires, the canvas cut after its first end token (PAD
after it), then appended causally to the cache; the answer ends at a
canvas holding an end token or after `max_out_length` tokens. Under
continuous batching a finished row's slot takes the next request between
canvases (reset_rows: it prefills at its next step). One loop step is
one denoising step of every running row; the prefill and the appends
(canvas_rows.py) run inside the steps that need them. The cache of the
prompt and the finished canvases is written once and read by every later
step.

Each row keeps the official key chain of a batch of one (the loop's key
split per canvas, the denoising key split per step), so a prompt alone
with seed s gives `gemma.diffusion.Sampler.sample(prompt, rng=s)`'s
tokens, and a row in a batch its alone tokens. Deliberate differences: the
official batch shares one key, RoPE position and cache index across rows
(a shorter prompt's canvas starts after the longest prompt, its local
layers see the padding), so its rows change with the batch; its cache is
`cache_length` slots (4096) that the canvases wrap around and that ends
the answer when full, where here the cache holds the prompt and every
canvas. Each forward is fast.forward (routed experts, attention over the
slots a row sees; batched on GPUs, a row at a time elsewhere) or,
with forward="rows", the plain reference one row at a time
(model.forward_rows), for checking.
End tokens: the
checkpoint's EOS, END_OF_TURN and BEGIN_OF_TOOL_RESPONSE (none with
stop_at_eos=False) plus `stop_tokens`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma import canvas_options as co
from flash_dllm_jax.architectures.diffusion_gemma import canvas_rows
from flash_dllm_jax.architectures.diffusion_gemma import model as dg
from flash_dllm_jax.architectures.diffusion_gemma import sampler_steps as st
from flash_dllm_jax.architectures.diffusion_gemma.canvas_options import (
    TokenIds)
from flash_dllm_jax.architectures.diffusion_gemma.canvas_rows import (
    CanvasRows)
from flash_dllm_jax.architectures.diffusion_gemma.fast import FORWARDS
from flash_dllm_jax.sampling import checks, options
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.state import DecodeState, where_keys


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaSampler:
  """The official sampler's settings under its own names and defaults.

  canvas_length / max_denoising_steps: canvas size and step budget.
  entropy_bound: SampleFromPredictions' bound. max_temperature /
  min_temperature / exponent: the AnnealingTemperatureShaper.
  early_stop: "chained" (token stability AND mean entropy <= 0.005, the
  official default), "token_stability", "entropy:<bound>" or "none".
  stop_tokens: ids that also end the answer. max_out_length: answer
  tokens (the official output buffer); the seed is generate's `seed`.
  forward: "fast" (fast.py) or "rows" (the reference, model.forward_rows).
  max_refills: under continuous batching, at most this many slots take a
  new request (and prefill) per loop step (None: any number).
  The sampling options (`row_fields`; not canvas_length and
  max_denoising_steps, which size arrays, nor forward and max_refills) may
  also differ per row (generate's `sampling`, a served request's values):
  a row decodes what this sampler with its values decodes.
  """

  canvas_length: int = option(256, "tokens per canvas", ge=1)
  max_denoising_steps: int = option(48, "denoising steps a canvas may take",
                                    ge=1)
  entropy_bound: float = option(0.1, "SampleFromPredictions' entropy bound "
                                "on accepting tokens")
  max_temperature: float = option(0.8, "the annealing's first temperature "
                                  "(>= min_temperature)")
  min_temperature: float = option(0.4, "the annealing's last temperature",
                                  ge=1e-12)  # the official _MIN_TEMP
  exponent: float = option(1.0, "the annealing's exponent")
  early_stop: str = option(
      "chained", "when a canvas stops denoising: chained (token stability "
      f"and mean entropy <= {st.CHAINED_ENTROPY}), token_stability, "
      "entropy:<bound> or none")
  stop_tokens: TokenIds | None = option(
      None, "token ids that also end the answer (e.g. 20,21)", none="none")
  max_out_length: int = option(2048, "answer tokens at most", ge=1)
  max_refills: int | None = max_refills(None, " (and prefill)")
  forward: str = option(
      "fast", "the model forward: fast (routed experts, windowed "
      "attention) or rows (the plain reference, one row at a time, for "
      "checking)", choices=tuple(FORWARDS))
  # Each answer token's log-probability: under the unshaped logits of the
  # denoising step that drew it (its canvas's last), as vLLM reports one.
  reports_logprobs = True
  # The state's RowSampling holds each row's values (row_sampling.Sampling;
  # canvas_options.py), so rows with different values share a program.
  row_fields: ClassVar[tuple[str, ...]] = co.ROW_FIELDS

  def __post_init__(self):
    options.check(self, self._joint_errors)
    object.__setattr__(self, "stop_tokens", TokenIds(self.stop_tokens or ()))

  def _joint_errors(self) -> list[str]:
    errors = []
    if self.max_temperature < self.min_temperature:
      errors.append(f"max_temperature ({self.max_temperature}) must be >= "
                    f"min_temperature ({self.min_temperature})")
    for check in (lambda: st.parse_early_stop(self.early_stop),
                  lambda: TokenIds(self.stop_tokens or ())):
      try:
        check()
      except ValueError as e:
        errors.append(str(e))
    return errors

  @property
  def gen_length(self) -> int:
    return self.max_out_length

  @property
  def canvases(self) -> int:
    return math.ceil(self.max_out_length / self.canvas_length)

  @property
  def tail_length(self) -> int:
    """The last canvas's positions past max_out_length."""
    return self.canvases * self.canvas_length - self.max_out_length

  @property
  def num_steps(self) -> int:
    return self.canvases * self.max_denoising_steps

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length + self.tail_length,
                      max_seq_len)

  def init_aux(self, model, tokens_BxN: jax.Array) -> CanvasRows:
    return canvas_rows.empty(model.config, *tokens_BxN.shape,
                             self.canvas_length)

  def finished(self, model, tokens_BxN, aux: CanvasRows, prompt_len: int):
    return aux.stop_B

  def reset_rows(self, aux: CanvasRows, rows_B: jax.Array) -> CanvasRows:
    """The rows take a new request (continuous batching): prefill at their
    next step. What the slot's cache holds past the new prompt is never
    read (a query sees only slots it or an earlier step wrote)."""
    return aux.replace(fresh_B=aux.fresh_B | rows_B,
                       stop_B=aux.stop_B & ~rows_B)

  # The rows' values as numpy CanvasOptions, a row's values past what the
  # program holds; the options the generic temperature (top_p / top_k:
  # refused) sets, for every entry point, and that temperature's meaning.
  row_arrays = co.host_arrays
  row_value_error = co.row_value_error
  draw_options = co.draw_options
  draw_specs: ClassVar[dict] = co.DRAW_SPECS
  draw_stated: ClassVar[dict] = co.DRAW_STATED

  def _options(self, state: DecodeState) -> co.CanvasOptions:
    """The rows' values: the state's RowSampling, else the sampler's own."""
    if state.sampling is not None and state.sampling.extra is not None:
      return state.sampling.extra
    rows = [None] * state.tokens_BxN.shape[0]
    return jax.tree.map(jnp.asarray, co.host_arrays(self, rows))

  def _accept(self, shaped, keys_B, opts, state: DecodeState, n_ids: int):
    """The next canvas from a step's shaped logits (st.accept)."""
    del state
    return st.accept(shaped, keys_B, opts.entropy_bound_B, n_ids)

  def _denoise(self, model, state: DecodeState, aux: CanvasRows, active_B,
               opts):
    """One denoising step of the active rows' canvases against the cache:
    (next canvas, shaped logits, the cache with the canvas K/V as scratch,
    the next key, the canvas tokens' log-probabilities under the step's
    unshaped logits)."""
    cfg, c = model.config, self.canvas_length
    slots = jnp.where(active_B[:, None],
                      aux.start_B[:, None] + jnp.arange(c), -1)
    logits, cache = FORWARDS[self.forward](
        model, model.params, cfg, aux.canvas_BxC, slots, aux.cache,
        dg.canvas(slots), aux.sc_BxCxD)
    noise = st.noise_proportions(self.max_denoising_steps)
    shaped = st.shape_logits(logits, co.temperatures(
        opts, noise[aux.step_B], logits.dtype))
    inner_next, sample = st.split2(aux.inner_B)
    canvas = self._accept(shaped, sample, opts, state, cfg.n_text_ids)
    return canvas, shaped, cache, inner_next, st.token_logprob(logits, canvas)

  def propose(self, model, state: DecodeState, rng_B: jax.Array,
              prompt_len: int):
    cfg, c = model.config, self.canvas_length
    active_B = ~state.done_B
    aux = state.aux
    fresh_B = active_B & aux.fresh_B
    aux = jax.lax.cond(
        jnp.any(fresh_B),
        lambda a: canvas_rows.prefill(self.forward, model, state, a, fresh_B,
                                      prompt_len, c),
        lambda a: a, aux)
    opts = self._options(state)
    canvas, shaped, cache, inner_next, lp_BxC = self._denoise(
        model, state, aux, active_B, opts)
    stop_now = co.should_stop(shaped, aux.canvas_BxC, opts)
    sc = dg.encode_logits(model.params, cfg, shaped).astype(jnp.bfloat16)
    keep = lambda new, old: jnp.where(
        active_B.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
    step_B = aux.step_B + 1
    aux = aux.replace(
        cache=cache, canvas_BxC=keep(canvas, aux.canvas_BxC),
        sc_BxCxD=keep(sc, aux.sc_BxCxD), step_B=keep(step_B, aux.step_B),
        inner_B=where_keys(active_B, inner_next, aux.inner_B))
    done_B = active_B & (stop_now | (step_B >= self.max_denoising_steps))
    is_end = co.has_stop(aux.canvas_BxC, opts)
    if model.stop_ids:
      is_end |= jnp.isin(aux.canvas_BxC,
                         jnp.asarray(model.stop_ids, jnp.int32))
    final, has_end = st.truncate(aux.canvas_BxC, is_end)
    at_BxC = aux.written_B[:, None] + jnp.arange(c)  # answer positions
    cols = prompt_len + at_BxC
    rows = jnp.arange(cols.shape[0])[:, None]
    write = done_B[:, None] & (at_BxC < opts.max_out_B[:, None])
    tokens_BxN = state.tokens_BxN.at[rows, cols].set(
        jnp.where(write, final, state.tokens_BxN[rows, cols]).astype(
            state.tokens_BxN.dtype))
    logprob_BxN = state.logprob_BxN.at[rows, cols].set(
        jnp.where(write, lp_BxC, state.logprob_BxN[rows, cols]))
    more_B = ~has_end & (aux.written_B + c < opts.max_out_B)
    next_B = done_B & more_B
    aux = aux.replace(stop_B=aux.stop_B | (done_B & ~more_B))
    aux = jax.lax.cond(jnp.any(next_B),
                       lambda a: canvas_rows.append(self.forward, model, a,
                                                    final, next_B),
                       lambda a: a, aux)
    forwards_B = (active_B.astype(jnp.int32) + fresh_B + next_B)
    return tokens_BxN, aux, forwards_B, logprob_BxN
