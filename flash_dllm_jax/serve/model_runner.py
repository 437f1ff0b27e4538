"""The device side of serving (vLLM's model runner): fixed slots decoding in
a compiled loop that refills them from a device-side queue.

One `ModelRunner` per sampler variant: B slots of shape [B, P + G] that
take any prompt of up to P tokens. A call (`cycle`) releases the slots the
host gave up and takes a queue of up to Q (= B) waiting requests; the
compiled loop loads queue entries into free slots (first at its start,
then after every step, as rows finish: sampling/slots.refill, the refill
rule of offline continuous batching) and runs until the call's step limit
(at most `steps_per_call`; the engine core shortens it while the slots
take new requests), until nothing is left to
decode, or until a row finished that no queue entry replaced (its answer
goes out, and a new arrival gets in, without waiting for the rest of the
call). Each request of the call is a job: j < B the
row in slot j at the call's start, B + q queue entry q; the call returns
each job's tokens (as it finished, or as it stands), which slot holds
which job, and how many queue entries it took (a prefix of the queue).
Shapes never change, the state is donated, and the executable
(serve/runner_program.py) is compiled once, ahead of time, at start.
Under a mesh the slots are split over its `data` axis.

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
import numpy as np

from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import compiler_options
from flash_dllm_jax.prompts import PROMPT_BUCKET
from flash_dllm_jax.sampling import Refillable, row_options
from flash_dllm_jax.sampling.loop import records_top, tail_length
from flash_dllm_jax.sampling.row_sampling import GREEDY, RowSampling
from flash_dllm_jax.sampling.slots import EMPTY
from flash_dllm_jax.serve.jobs import Jobs, pack_queue
from flash_dllm_jax.serve.protocol import MAX_LOGPROBS
from flash_dllm_jax.serve.runner_program import RunnerProgram


class ModelRunnerOutput(NamedTuple):
  """What the host reads after a call, per job J = B + Q (module
  docstring). tokens_JxG: the generation region as the job finished or
  stands (mask id where undecided); done_J: its row stopped; steps_J,
  forwards_J: its counters; iters: decoding steps this call ran;
  logprobs_JxG: each committed token's log-probability at its commit step
  (DecodeState.logprob_BxN); top_logprobs_JxGxK / top_ids_JxGxK: their
  alternatives, likeliest first, from a call that recorded them
  (dispatch(top=True)), else None. job_B: the job each slot's running row
  is (EMPTY: the slot is free); taken: queue entries loaded (the first
  `taken`); at_Q: the step after which each was loaded (0: the call's
  start)."""

  tokens_JxG: np.ndarray
  done_J: np.ndarray
  steps_J: np.ndarray
  forwards_J: np.ndarray
  iters: int
  logprobs_JxG: np.ndarray | None = None
  top_logprobs_JxGxK: np.ndarray | None = None
  top_ids_JxGxK: np.ndarray | None = None
  job_B: np.ndarray | None = None
  taken: int = 0
  at_Q: np.ndarray | None = None


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
    self.q = slots  # queue entries a call takes
    self.continuous = isinstance(sampler, Refillable)
    self.stop_ids = config.stop_token_ids if stop_at_eos else ()
    self.implementation = implementation
    self.row_data = row_options.takes_rows(sampler)  # RowSampling
    self.top_k = top_logprobs if records_top(sampler) else 0  # buffer width
    self._mesh = mesh
    self._program = RunnerProgram(
        config, sampler, implementation, self.stop_ids, self.p, self.b,
        self.q, self.g, self.g_all, self.top_k, self.row_data)
    self._state = self._place(self._program.initial_state(params))
    self._busy_B = np.zeros(self.b, bool)  # rows whose loop has not stopped
    self._uncollected = False
    self._compiled = self._compile(record_top=False)
    self._compiled_top = self._compile(True) if self.top_k else None

  def _compile(self, record_top: bool):
    """The call's program, ahead of time; record_top: the variant that
    fills the top-logprobs buffer (top_logprobs.py)."""
    q = self.q
    args = (self.params, self._state, np.zeros(self.b, bool),
            np.zeros((q, self.p), np.int32), np.zeros((q, self.p), bool),
            np.zeros(q, np.uint32), np.zeros((), np.int32),
            np.zeros((), np.int32), self._host_sampling([]))
    shardings, mesh = {}, self._mesh
    if mesh is not None:
      state_s = jax.tree.map(lambda x: self._row_sharding(mesh, x),
                             self._state)
      rows = parallel.NamedSharding(mesh, parallel.P("data"))
      rep = parallel.NamedSharding(mesh, parallel.P())
      shardings = dict(
          in_shardings=(parallel.param_shardings(mesh, self.config,
                                                 self.params), state_s,
                        rows, rep, rep, rep, rep, rep, rep),
          out_shardings=(state_s, rep, rows, rep, rep))
    jitted = jax.jit(functools.partial(self._cycle, record_top=record_top),
                     donate_argnums=(1,), compiler_options=compiler_options(),
                     **shardings)
    with parallel.use(mesh):
      return jitted.lower(*args).compile()

  def _cycle(self, *args, record_top: bool):
    """RunnerProgram.cycle under the name that keys its compiled program
    (jit__cycle, the --compile-cache entries)."""
    return self._program.cycle(*args, record_top=record_top)

  def reset(self) -> None:
    """Fresh slot state (every slot free), as at start; the compiled
    program is kept. What the server does after a failed call, whose
    donated state may be gone."""
    self._state = self._place(self._program.initial_state(self.params))
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
    """RowSampling numpy arrays of the queue, GREEDY where `rows` (entry,
    Sampling) says nothing; None for a sampler that takes no row data."""
    if not self.row_data:
      return None
    settings = [GREEDY] * self.q
    for slot, sampling in rows:
      settings[slot] = sampling
    return RowSampling.host(settings, self.sampler)

  # Host API -----------------------------------------------------------------
  def cycle(self, release=(), queue=(),
            steps: int | None = None) -> ModelRunnerOutput:
    """release: slots to stop; queue: [(prompt ids, seed[, Sampling])],
    at most `q` waiting requests the call loads, in order, into slots as
    they free up; steps: the call's step limit (default steps_per_call).
    One host round trip: `collect(dispatch(...))`."""
    return self.collect(self.dispatch(release, queue, steps=steps))

  def busy_slots(self) -> set[int]:
    """Slots whose row the device still decodes (as of the last collect)."""
    return {int(i) for i in np.flatnonzero(self._busy_B)}

  def dispatch(self, release=(), queue=(), top: bool = False,
               steps: int | None = None) -> "InFlight":
    """Starts a call (see `cycle`) and returns at once: JAX runs it
    asynchronously, so the host can work on the last call's output
    meanwhile. `collect` its handle before the next dispatch (which donates
    the state its arrays belong to). top: record the top-logprobs of what
    this call commits (a row that wants them needs every call from its
    admission on to record)."""
    if top and not self.top_k:
      raise ValueError(f"this runner records no top logprobs "
                       f"({type(self.sampler).__name__}, top_logprobs 0)")
    if self._uncollected:
      raise RuntimeError("the last dispatched call was not collected")
    steps = self.k if steps is None else steps
    if not 1 <= steps <= self.k:
      raise ValueError(f"steps {steps}: not in [1, {self.k}]")
    release_B = np.zeros(self.b, bool)
    release_B[list(release)] = True
    prompt_QxP, valid_QxP, seed_Q, rows = pack_queue(
        queue, self.q, self.p, self.config.pad_token_id)
    if rows and not self.row_data and any(r != GREEDY for _, r in rows):
      raise ValueError(f"{type(self.sampler).__name__} takes no row data")
    program = self._compiled_top if top else self._compiled
    self._state, jobs, job_B, taken, iters = program(
        self.params, self._state, release_B, prompt_QxP, valid_QxP, seed_Q,
        np.int32(len(queue)), np.int32(steps), self._host_sampling(rows))
    self._uncollected = True
    return InFlight(jobs, job_B, taken, iters)

  def collect(self, call: "InFlight") -> ModelRunnerOutput:
    """Waits for a dispatched call and reads its output."""
    j = jax.tree.map(np.asarray, call.jobs)
    out = ModelRunnerOutput(
        j.tokens_JxG, j.done_J, j.steps_J, j.forwards_J, int(call.iters),
        j.logprob_JxG, j.top_lp_JxGxK, j.top_id_JxGxK,
        np.asarray(call.job_B), int(call.taken), j.at_Q)
    self._busy_B, self._uncollected = out.job_B != EMPTY, False
    return out


class InFlight(NamedTuple):
  """A dispatched call's device results (not yet read): its Jobs, job_B,
  taken and iters."""

  jobs: Jobs
  job_B: jax.Array
  taken: jax.Array
  iters: jax.Array
