"""The device side of serving (vLLM's model runner): fixed slots decoding in
a compiled loop that returns to the host at admission points.

One `ModelRunner` per sampler variant: B slots of shape [B, P + G] that
take any prompt of up to P tokens. A call (`cycle`) first releases the
slots the host gave up, loads new requests into free slots, then runs
decoding steps on device until a busy slot finishes or `steps_per_call`
steps have run. Shapes never
change, the state is donated, and the executable is compiled once, ahead of
time, at start. Under a mesh the slots are split over its `data` axis.

Each row is left-padded to P, a multiple of prompts.PROMPT_BUCKET, so it
holds its offline layout (padded to its own bucket) plus whole key tiles of
padding, which the attention's tiled key sums pass through bit for bit
(prompts.left_pad). It draws from its own PRNG key (the request's seed), and
a row's tokens never depend on the other rows (see
`generate.compiler_options`), so a request's answer equals offline
`generate` of its prompt whatever else shares the slots.

Rows enter and leave the slots through sampling/slots.py, as offline
decoding's do. Refillable samplers (`strategies.refilling()` names them)
take new rows while others decode ("continuous"). The others keep one step
counter for the batch (their block schedule reads it), so the pool admits
new rows only once all of its slots are free ("batch").
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import compiler_options
from flash_dllm_jax.prompts import PROMPT_BUCKET
from flash_dllm_jax.sampling import Refillable, make_step
from flash_dllm_jax.sampling import row_options, slots
from flash_dllm_jax.sampling.loop import records_top, tail_length
from flash_dllm_jax.sampling.row_sampling import GREEDY, RowSampling
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.slots import SlotState
from flash_dllm_jax.serve.protocol import MAX_LOGPROBS


class ModelRunnerOutput(NamedTuple):
  """What the host reads after a call. tokens_BxG: the generation region
  (mask id where undecided); done_B, steps_B, forwards_B: per slot; iters:
  decoding steps this call ran; logprobs_BxG: each committed token's
  log-probability at its commit step (DecodeState.logprob_BxN);
  top_logprobs_BxGxK / top_ids_BxGxK: their alternatives, likeliest first,
  from a call that recorded them (dispatch(top=True)), else None."""

  tokens_BxG: np.ndarray
  done_B: np.ndarray
  steps_B: np.ndarray
  forwards_B: np.ndarray
  iters: int
  logprobs_BxG: np.ndarray | None = None
  top_logprobs_BxGxK: np.ndarray | None = None
  top_ids_BxGxK: np.ndarray | None = None


class ModelRunner:
  """B slots for prompts of up to `prompt_len` tokens (a multiple of
  prompts.PROMPT_BUCKET), left-padded to it. mesh (a jax
  Mesh, parallel.parse_mesh): the slots split over its `data` axis and the
  weights over `model`, as `generate(mesh=)` does. implementation: the
  kernel choice, a name or an ops.Kernels (`generate(kernels=)`).
  top_logprobs: alternatives per token a call may record (--max-logprobs;
  0: none); for a sampler that records them, that program compiles here."""

  def __init__(self, params, config: ModelConfig, sampler, *,
               prompt_len: int, slots: int, steps_per_call: int,
               stop_at_eos: bool = True, implementation=None,
               mesh=None, top_logprobs: int = 0):
    if not 0 <= top_logprobs <= MAX_LOGPROBS:
      raise ValueError(f"top_logprobs {top_logprobs}: not in [0, "
                       f"{MAX_LOGPROBS}]")
    if prompt_len % PROMPT_BUCKET:
      raise ValueError(f"prompt_len ({prompt_len}) must be a multiple of "
                       f"{PROMPT_BUCKET}: the padding a slot adds to a "
                       "prompt's own must come in whole key tiles")
    if mesh is not None:
      parallel.check_config(config, mesh)
      if slots % parallel.data_size(mesh):
        raise ValueError(f"slots ({slots}) must be a multiple of the mesh's "
                         f"data size ({parallel.data_size(mesh)})")
      params = parallel.shard_params(mesh, config, params)
    self.params, self.config, self.sampler = params, config, sampler
    self.p, self.b, self.g = prompt_len, slots, sampler.gen_length
    self.g_all = self.g + tail_length(sampler)  # positions after the prompt
    self.k = steps_per_call
    self.continuous = isinstance(sampler, Refillable)
    self.stop_ids = config.stop_token_ids if stop_at_eos else ()
    self.implementation = implementation
    self.row_data = row_options.takes_rows(sampler)  # RowSampling
    self.top_k = top_logprobs if records_top(sampler) else 0  # buffer width
    self._mesh = mesh
    self._state = self._place(self._initial_state())
    self._busy_B = np.zeros(self.b, bool)  # rows whose loop has not stopped
    self._uncollected = False
    self._compiled = self._compile(record_top=False)
    self._compiled_top = self._compile(True) if self.top_k else None

  def _compile(self, record_top: bool):
    """The call's program, ahead of time; record_top: the variant that
    fills the top-logprobs buffer (top_logprobs.py)."""
    args = (self.params, self._state, np.zeros(self.b, bool),
            np.zeros(self.b, bool), np.zeros((self.b, self.p), np.int32),
            np.zeros((self.b, self.p), bool), np.zeros(self.b, np.uint32),
            self._host_sampling([]))
    shardings, mesh = {}, self._mesh
    if mesh is not None:
      state_s = jax.tree.map(lambda x: self._row_sharding(mesh, x),
                             self._state)
      rows = parallel.NamedSharding(mesh, parallel.P("data"))
      shardings = dict(
          in_shardings=(parallel.param_shardings(mesh, self.config,
                                                 self.params), state_s,
                        rows, rows, rows, rows, rows, rows),
          out_shardings=(state_s, rows, rows,
                         parallel.NamedSharding(mesh, parallel.P()))
          + (rows, rows) * record_top)
    jitted = jax.jit(functools.partial(self._cycle, record_top=record_top),
                     donate_argnums=(1,), compiler_options=compiler_options(),
                     **shardings)
    with parallel.use(mesh):
      return jitted.lower(*args).compile()

  def reset(self) -> None:
    """Fresh slot state (every slot free), as at start; the compiled
    program is kept. What the server does after a failed call, whose
    donated state may be gone."""
    self._state = self._place(self._initial_state())
    self._busy_B = np.zeros(self.b, bool)
    self._uncollected = False

  def _place(self, state):
    """`state` on the mesh (slot axis over `data`), or as it is."""
    if self._mesh is None:
      return state
    return jax.tree.map(
        lambda x: jax.device_put(x, self._row_sharding(self._mesh, x)), state)

  def _row_sharding(self, mesh, x):
    """Leaves with a slot axis split over `data`; the rest replicated."""
    spec = parallel.P("data") if x.ndim and x.shape[0] == self.b else \
        parallel.P()
    return parallel.NamedSharding(mesh, spec)

  def _host_sampling(self, rows):
    """RowSampling numpy arrays, GREEDY where `rows` (slot, Sampling) says
    nothing; None for a sampler that takes no row data."""
    if not self.row_data:
      return None
    settings = [GREEDY] * self.b
    for slot, sampling in rows:
      settings[slot] = sampling
    return RowSampling.host(settings, self.sampler)

  # Device functions -------------------------------------------------------
  def _model(self, params, valid_BxN, stop_ids=()):
    return SequenceModel.for_batch(self.config, params, valid_BxN,
                                   self.implementation, stop_ids)

  def _initial_state(self) -> SlotState:
    """Every slot empty (slots.start, done)."""
    b = self.b
    return slots.start(
        self.sampler, lambda v: self._model(self.params, v, self.stop_ids),
        jnp.full((b, self.p), self.config.pad_token_id, jnp.int32),
        jnp.ones((b, self.p), bool), self.g_all, self.config.mask_token_id,
        jax.vmap(jax.random.key)(jnp.zeros((b,), jnp.uint32)),
        RowSampling.of([GREEDY] * b, self.sampler) if self.row_data
        else None, done=True,
        top_k=self.top_k)

  def _cycle(self, params, state: SlotState, release_B, load_B, prompt_BxP,
             valid_BxP, seed_B, sampling, record_top: bool):
    """Releases, admits, then decodes until a busy row finishes or k steps
    ran. Returns (state, gen_BxG, logprob_BxG, iters[, top lp_BxGxK,
    id_BxGxK with record_top]); without it the top buffer passes through."""
    kept = state.decode.top
    if not record_top:
      state = state.replace(decode=state.decode.replace(top=None))
    state = slots.admit(
        slots.release(state, release_B), load_B, prompt_BxP, valid_BxP,
        jax.vmap(jax.random.key)(seed_B), sampling, sampler=self.sampler,
        mask_id=self.config.mask_token_id,
        model_for=lambda v: self._model(params, v, self.stop_ids))
    model = self._model(params, state.valid_BxN, self.stop_ids)
    step_fn = make_step(self.sampler, model, self.p, self.stop_ids)
    max_steps = self.sampler.num_steps

    def body(carry):
      s, i = carry
      d = step_fn(s.decode)
      d = d.replace(done_B=d.done_B | (d.steps_B >= max_steps))
      return s.replace(decode=d), i + 1

    def running(carry):
      s, i = carry
      d = s.decode
      finished = jnp.any(d.done_B & ~start_done_B)
      return (i < self.k) & jnp.any(~d.done_B) & ~finished

    start_done_B = state.decode.done_B
    state, iters = jax.lax.while_loop(running, body,
                                      (state, jnp.zeros((), jnp.int32)))
    gen, d = slice(self.p, self.p + self.g), state.decode
    out = d.tokens_BxN[:, gen], d.logprob_BxN[:, gen], iters
    if record_top:
      return (state, *out, d.top.lp_BxNxK[:, gen], d.top.id_BxNxK[:, gen])
    return (state.replace(decode=d.replace(top=kept)), *out)

  # Host API -----------------------------------------------------------------
  def free_slots(self, releasing=()) -> list[int]:
    """Slots requests may load into at the next call, counting `releasing`
    as free (the refill rule, slots.free_slots: in batch mode none until
    every slot is free)."""
    busy_B = self._busy_B.copy()
    busy_B[list(releasing)] = False
    return slots.free_slots(self.sampler, busy_B, per_call=True)

  def cycle(self, release=(),
            admit: dict | None = None) -> ModelRunnerOutput:
    """release: slots to stop; admit: {slot: (prompt ids, seed[, Sampling])}
    for free slots. One host round trip: `collect(dispatch(...))`."""
    return self.collect(self.dispatch(release, admit))

  def busy_slots(self) -> set[int]:
    """Slots whose row the device still decodes (as of the last collect)."""
    return {int(i) for i in np.flatnonzero(self._busy_B)}

  def dispatch(self, release=(), admit: dict | None = None,
               top: bool = False) -> "InFlight":
    """Starts a call (see `cycle`) and returns at once: JAX runs it
    asynchronously, so the host can work on the last call's output
    meanwhile. `collect` its handle before the next dispatch (which donates
    the state its done / steps / forwards arrays belong to). top: record
    the top-logprobs of what this call commits (a row that wants them needs
    every call from its admission on to record)."""
    if top and not self.top_k:
      raise ValueError(f"this runner records no top logprobs "
                       f"({type(self.sampler).__name__}, top_logprobs 0)")
    if self._uncollected:
      raise RuntimeError("the last dispatched call was not collected")
    admit = admit or {}
    release_B = np.zeros(self.b, bool)
    release_B[list(release)] = True
    load_B = np.zeros(self.b, bool)
    prompt_BxP = np.full((self.b, self.p), self.config.pad_token_id, np.int32)
    valid_BxP = np.zeros((self.b, self.p), bool)
    seed_B = np.zeros(self.b, np.uint32)
    rows = []
    for slot, (ids, seed, *sampling) in admit.items():
      if self._busy_B[slot] and not release_B[slot]:
        raise RuntimeError(f"slot {slot} is busy")
      if not 0 < len(ids) <= self.p:
        raise ValueError(f"slot {slot}: a prompt of {len(ids)} tokens (the "
                         f"slots take 1 to {self.p})")
      load_B[slot] = True
      prompt_BxP[slot, self.p - len(ids):] = ids
      valid_BxP[slot, self.p - len(ids):] = True
      seed_B[slot] = np.uint32(seed)
      rows += [(slot, sampling[0])] if sampling else []
    if rows and not self.row_data and any(r != GREEDY for _, r in rows):
      raise ValueError(f"{type(self.sampler).__name__} takes no row data")
    program = self._compiled_top if top else self._compiled
    self._state, gen, logp, iters, *top_out = program(
        self.params, self._state, release_B, load_B, prompt_BxP, valid_BxP,
        seed_B, self._host_sampling(rows))
    d = self._state.decode
    self._uncollected = True
    return InFlight(gen, d.done_B, d.steps_B, d.forwards_B, iters, logp,
                    tuple(top_out) or None)

  def collect(self, call: "InFlight") -> ModelRunnerOutput:
    """Waits for a dispatched call and reads its output."""
    top = (None, None) if call.top is None else tuple(
        np.asarray(x) for x in call.top)
    out = ModelRunnerOutput(*(np.asarray(x) for x in call[:4]),
                            int(call.iters), np.asarray(call.logprobs), *top)
    self._busy_B, self._uncollected = ~out.done_B, False
    return out


class InFlight(NamedTuple):
  """A dispatched call's device arrays (ModelRunnerOutput's fields, not yet
  read)."""

  tokens: jax.Array
  done: jax.Array
  steps: jax.Array
  forwards: jax.Array
  iters: jax.Array
  logprobs: jax.Array
  top: tuple | None = None  # (lp_BxGxK, id_BxGxK) of a recording call
