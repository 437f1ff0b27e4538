"""`generate`: prompts in, answers out, the whole decode in one compiled loop."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.sampling import (DecodeState, DreamSampler, LLaDASampler,
                                     Sampler, make_step, run_compiled,
                                     run_python)
from flash_dllm_jax.sampling import checks, continuous
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import fill_after_stop

PROMPT_BUCKET = 32  # prompts are left-padded to a multiple of this (fewer compiles)


class GenerateOutput(NamedTuple):
  """texts[b]: the answer up to its first stop token, special tokens removed.
  tokens_BxG: generated ids (masks left after a stop token become pad).
  forwards_B: model forward passes spent on each row.
  steps: decoding steps the loop ran, summed over the batches of different
    prompt-length buckets (each bucket decodes as its own batch).
  steps_B: decoding steps each row ran (a row stops once complete).
  """

  texts: list[str] | None
  tokens_BxG: np.ndarray
  forwards_B: np.ndarray
  steps: int
  steps_B: np.ndarray


def default_sampler(config: ModelConfig, **options: Any) -> Sampler:
  """The architecture's reference sampler built from keyword options."""
  cls = LLaDASampler if config.arch == "llada" else DreamSampler
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(options) - names)
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} for {cls.__name__}; "
                     f"expected some of {sorted(names)}")
  return cls(**options)


def padded_length(n: int, bucket: int = PROMPT_BUCKET,
                  room: int | None = None) -> int:
  """n rounded up to a multiple of bucket, but to no more than `room` (the
  positions the model leaves for a prompt) where n itself fits: padding
  never makes a fitting prompt fail."""
  p = -(-n // bucket) * bucket
  return p if room is None else max(n, min(p, room))


def left_pad(rows: Sequence[Sequence[int]], pad_id: int,
             bucket: int = PROMPT_BUCKET,
             room: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(ids_BxP int32, valid_BxP bool), P rounded up to a multiple of bucket
  (capped at room, see `padded_length`).

  Pads are masked keys and RoPE positions count from each row's first real
  token, so extra left padding changes a row's result only through the
  order of floating-point sums (see `bucket_groups`).
  """
  if not rows or any(len(r) == 0 for r in rows):
    raise ValueError("every prompt needs at least one token")
  p = padded_length(max(len(r) for r in rows), bucket, room)
  ids = np.full((len(rows), p), pad_id, np.int32)
  valid = np.zeros((len(rows), p), bool)
  for b, row in enumerate(rows):
    ids[b, p - len(row):] = row
    valid[b, p - len(row):] = True
  return ids, valid


def bucket_groups(rows: Sequence[Sequence[int]], bucket: int = PROMPT_BUCKET,
                  room: int | None = None) -> list[np.ndarray]:
  """Row indices grouped by padded prompt length (each row's own length
  rounded up to `bucket`, capped at room), longest first.

  Each group decodes as its own batch, so a row's padding, and with it every
  floating-point sum over its keys, depends on the row alone: in bfloat16,
  extra left padding changes the reduction order enough to flip near-tied
  tokens, which would make an answer depend on the batch it came in.
  """
  padded = np.array([padded_length(len(r), bucket, room) for r in rows])
  return [np.flatnonzero(padded == p) for p in sorted(set(padded),
                                                       reverse=True)]


def _decode_rows(params, rows, seeds, *, config: ModelConfig,
                 sampler: Sampler, stop_at_eos: bool, batch_size: int | None,
                 mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """(gen_BxG, forwards_B, steps_B, loop steps) of one padded batch, through
  continuous batching when batch_size < len(rows), over the mesh if any."""
  ids, valid = left_pad(rows, config.pad_token_id,
                        room=config.max_seq_len - sampler.gen_length)
  n_rows = len(rows)
  if mesh is not None:
    if batch_size is not None and batch_size < n_rows:
      raise ValueError("mesh= and continuous batching (batch_size=) cannot be "
                       "combined yet")
    pad = -n_rows % parallel.data_size(mesh)
    ids, valid = (np.concatenate([a, np.repeat(a[-1:], pad, 0)])
                  for a in (ids, valid))
    seeds = list(seeds) + [seeds[-1]] * pad
  rng_B = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
  ids, valid = jnp.asarray(ids), jnp.asarray(valid)
  if mesh is not None:
    ids, valid, rng_B = (parallel.shard_rows(mesh, a)
                         for a in (ids, valid, rng_B))
  if batch_size is not None and batch_size < n_rows:
    gen, forwards, steps_b, steps = _queue_jit(
        params, ids, valid, rng_B, config=config,
        sampler=sampler, batch_size=batch_size, stop_at_eos=stop_at_eos)
  else:
    with parallel.use(mesh):
      gen, forwards, steps, steps_b = decode_jit(
          params, ids, valid, rng_B,
          config=config, sampler=sampler, stop_at_eos=stop_at_eos)
  gen, forwards, steps_b = (np.asarray(a)[:n_rows]
                            for a in (gen, forwards, steps_b))
  return gen, forwards, steps_b, int(steps)


def decode_tokens(params, prompt_BxP: jax.Array, valid_BxP: jax.Array,
                  rng_B: jax.Array, *, config: ModelConfig, sampler: Sampler,
                  stop_at_eos: bool = True, compiled: bool = True,
                  implementation: str | None = None):
  """The decode as a pure function of device arrays (jit it with config,
  sampler, stop_at_eos, compiled and implementation static; under a mesh,
  trace it inside `parallel.use(mesh)`). Returns (gen_BxG, forwards_B,
  steps, steps_B). implementation: kernel choice (flash_dllm_jax/ops.py)."""
  b, p = prompt_BxP.shape
  valid_BxN = jnp.concatenate(
      [valid_BxP, jnp.ones((b, sampler.gen_length), bool)], axis=1)
  stop_ids = config.stop_token_ids if stop_at_eos else ()
  model = SequenceModel.for_batch(config, params, valid_BxN,
                                  implementation, stop_ids=stop_ids)
  step_fn = make_step(sampler, model, p, stop_ids)
  state = DecodeState.start(prompt_BxP, sampler.gen_length,
                            config.mask_token_id, rng_B)
  state = state.replace(aux=sampler.init_aux(model, state.tokens_BxN))
  run = run_compiled if compiled else run_python
  state = run(step_fn, state, sampler.num_steps)
  gen_BxG = fill_after_stop(state.tokens_BxN[:, p:], config.mask_token_id,
                            config.pad_token_id)
  return gen_BxG, state.forwards_B, state.step, state.steps_B


# XLA:CPU (jax 0.10) hands a reduction, with the elementwise ops around it,
# to a YNNPACK fusion once it has about 4096 rows (B x Q), and keeps its own
# loop below that. The two differ in the last bits: the YNNPACK fusion drops
# the float32 -> bfloat16 -> float32 round trip inside RMSNorm and sums in
# another order (the attention mass). So a row's logits, and then its tokens,
# depended on how many rows shared its batch: 4 of 64 shipped-model answers
# changed between eval batch 64 and 8. Without YNNPACK fusions every
# reduction is XLA's own loop at every batch size (the decode loop's state
# is then bitwise the same for a row alone and in any batch).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
# XLA:GPU chooses a GEMM's algorithm per shape (Triton tilings, split-K
# included, then cuBLAS algorithms by autotuning), so a row's sums over K
# could change with the number of rows: the shipped model's down projection
# over 9 x 144 rows differed from 17 x 144 (H200, 2026-11-30: 1-2 of 128
# answers changed under data=2). cuBLAS without autotuning gave a row the
# same bits at every probed M, LLaDA-8B's shapes included, where either flag
# alone did not (BENCHMARKS.md, "Batch invariance"): measured, not a promise
# from XLA. It cost 15% at batch 1 and saved 6% at batch 32 in the step.
# XLA's dot merger joined k_proj and v_proj into one GEMM by concatenating
# their weights in every layer of every pass (LLaDA-8B: 67 MB, ~31 us each;
# 2 ms of a 15 ms batch-1 step, profile_step.py), and only below a size, so
# the GEMM shapes also depended on the number of rows: off.
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False,
                        "xla_gpu_autotune_level": 0,
                        "xla_gpu_dot_merger_threshold_mb": 0}


def compiler_options(backend: str | None = None) -> dict | None:
  """The decode loops' XLA options for `backend` (default: the current
  one): CPU_COMPILER_OPTIONS, GPU_COMPILER_OPTIONS, or None (XLA's own)."""
  backend = backend or jax.default_backend()
  return {"cpu": CPU_COMPILER_OPTIONS, "gpu": GPU_COMPILER_OPTIONS,
          "cuda": GPU_COMPILER_OPTIONS}.get(backend)


class _BatchInvariantJit:
  """`jax.jit(fn, static_argnames=...)`, compiled with CPU_COMPILER_OPTIONS on
  the CPU backend and GPU_COMPILER_OPTIONS on a GPU (others get XLA's
  defaults). Attributes such as `lower` are the jitted function's for the
  current default backend."""

  def __init__(self, fn, static_argnames: tuple[str, ...]):
    self._fn, self._static = fn, static_argnames
    self._by_backend: dict[str, Any] = {}
    self.__doc__, self.__wrapped__ = fn.__doc__, fn

  def _jitted(self):
    backend = jax.default_backend()  # chosen at call time, never at import
    if backend not in self._by_backend:
      self._by_backend[backend] = jax.jit(
          self._fn, static_argnames=self._static,
          compiler_options=compiler_options(backend))
    return self._by_backend[backend]

  def __call__(self, *args, **kwargs):
    return self._jitted()(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted(), name)


decode_jit = _BatchInvariantJit(decode_tokens, static_argnames=(
    "config", "sampler", "stop_at_eos", "compiled", "implementation"))
_queue_jit = _BatchInvariantJit(continuous.decode_queue, static_argnames=(
    "config", "sampler", "batch_size", "stop_at_eos", "implementation"))


def _as_token_rows(prompt, tokenizer, chat: bool) -> list[list[int]]:
  if isinstance(prompt, str):
    prompt = [prompt]
  if isinstance(prompt, np.ndarray) or isinstance(prompt, jax.Array):
    prompt = np.asarray(prompt).tolist()
  if not isinstance(prompt, (list, tuple)) or not prompt:
    raise TypeError("prompt must be a string, a list of strings, a list of "
                    "token ids or a list of such lists")
  if all(isinstance(x, (int, np.integer)) for x in prompt):
    return [list(map(int, prompt))]
  if all(isinstance(x, str) for x in prompt):
    if tokenizer is None:
      raise ValueError("text prompts need a tokenizer")
    if chat:
      prompt = [tokenizer.apply_chat_template(
          [{"role": "user", "content": x}], add_generation_prompt=True)
                for x in prompt]
    return [tokenizer.encode(x) for x in prompt]
  if all(isinstance(x, (list, tuple, np.ndarray)) for x in prompt):
    return [list(map(int, x)) for x in prompt]
  raise TypeError("prompt must be a string, a list of strings, a list of "
                  "token ids or a list of such lists")


def generate(model, prompt, *, config: ModelConfig | None = None,
             tokenizer=None, sampler: Sampler | None = None,
             chat: bool = False, seed: int | Sequence[int] = 0,
             stop_at_eos: bool = True, batch_size: int | None = None,
             mesh=None,
             **options: Any) -> GenerateOutput:
  """Generates answers for one prompt or a left-padded batch.

  model: what `load` returns (params, config, tokenizer), or a params tree
    with `config=` (and `tokenizer=` for text).
  prompt: a string, a list of strings, token ids, or a list of id lists.
    Prompts are left-padded to a multiple of PROMPT_BUCKET (less where that
    would not fit the model); each bucket present decodes as its own batch
    (see `bucket_groups`).
  chat: apply the checkpoint's chat template to text prompts.
  sampler: a sampler object; by default the architecture's reference sampler
    built from `options` (LLaDA: gen_length, steps, block_length, temperature,
    cfg_scale, remasking, logits_eos_inf, confidence_eos_eot_inf; Dream:
    gen_length, steps, eps, alg, temperature, top_p, top_k, alg_temp).
  seed: one seed for every row, or one per row. A row's random draws come
    from its own seed only, so its answer never depends on the rest of the
    batch.
  stop_at_eos: a row stops once nothing before its first EOS/EOT is masked.
  batch_size: decode through this many slots with continuous batching (a
    finished slot takes the next prompt inside the compiled loop); for
    samplers with `reset_rows` (Flash-dLLM). None: one batch of all prompts.
  mesh: 'data=D,model=M' or a jax Mesh (parallel.parse_mesh): split the
    batch over D devices (padded to a multiple of D with copies of the last
    prompt, which are dropped) and the weights and KV cache over M
    (tensor parallelism; M must divide the heads, KV heads and MLP width).
    Weights not already on their shards (see `load(mesh=)`) are moved
    there.
  """
  if isinstance(model, tuple) and len(model) == 3:
    params, config, tokenizer = model
  else:
    params = model
  if config is None:
    raise ValueError("pass config= (or the (params, config, tokenizer) that "
                     "load returns)")
  if sampler is None:
    sampler = default_sampler(config, **options)
  elif options:
    raise ValueError(f"options {sorted(options)} given together with sampler=")
  rows = _as_token_rows(prompt, tokenizer, chat)
  for i, row in enumerate(rows):
    if why := checks.token_error(row, config.mask_token_id, config.vocab_size):
      raise ValueError(f"prompt {i} {why}")
  checks.check_lengths([len(r) for r in rows], sampler, config.max_seq_len)
  seeds = [seed] * len(rows) if isinstance(seed, (int, np.integer)) else seed
  if len(seeds) != len(rows):
    raise ValueError(f"{len(seeds)} seeds for {len(rows)} prompts")
  if batch_size is not None and batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  mesh = parallel.parse_mesh(mesh)
  parallel.check_config(config, mesh)
  if mesh is not None:
    params = parallel.shard_params(mesh, params)
  n_rows = len(rows)
  gen = np.zeros((n_rows, sampler.gen_length), np.int32)
  forwards, steps_b, steps = (np.zeros(n_rows, np.int32),
                              np.zeros(n_rows, np.int32), 0)
  for group in bucket_groups(rows,
                             room=config.max_seq_len - sampler.gen_length):
    out = _decode_rows(params, [rows[i] for i in group],
                       [seeds[i] for i in group], config=config,
                       sampler=sampler, stop_at_eos=stop_at_eos,
                       batch_size=batch_size, mesh=mesh)
    gen[group], forwards[group], steps_b[group] = out[:3]
    steps += out[3]
  texts = None
  if tokenizer is not None:
    texts = [tokenizer.decode(answer_ids(row, config)) for row in gen]
  return GenerateOutput(texts, gen, forwards, steps, steps_b)


def answer_ids(gen_G: np.ndarray, config: ModelConfig) -> list[int]:
  """The generated ids up to (not including) the first stop token."""
  out = []
  for t in gen_G.tolist():
    if t in config.stop_token_ids:
      break
    out.append(t)
  return out
