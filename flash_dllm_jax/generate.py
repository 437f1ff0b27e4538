"""`generate`: prompts in, answers out, the whole decode in one compiled loop."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from flash_dllm_jax import (architectures, ops, parallel, prompts, quantize,
                            strategies)
from flash_dllm_jax.compilation import (CPU_COMPILER_OPTIONS,  # noqa: F401
                                        GPU_COMPILER_OPTIONS,
                                        compiler_options)
from flash_dllm_jax.config import ModelConfig
# decode_jit / decode_tokens: also imported from here (benchmarks, tools)
from flash_dllm_jax.decode import (decode_jit, decode_rows,  # noqa: F401
                                   decode_tokens)
from flash_dllm_jax.prompts import bucket_groups
from flash_dllm_jax.sampling import Sampler
from flash_dllm_jax.sampling import checks, row_options
from flash_dllm_jax.sampling.loop import Refillable, tail_length
from flash_dllm_jax.sampling.row_sampling import Sampling, row_settings


class GenerateOutput(NamedTuple):
  """texts[b]: the answer up to its first stop token, special tokens removed.
  tokens_BxG: generated ids (masks left after a stop token become pad).
  forwards_B: model forward passes spent on each row: a Flash-dLLM step with
    a verify pass counts 2, a classifier-free-guidance step counts 2 (the
    conditional and the unconditional pass; LLaDA's reference counts its one
    call on the doubled batch as one NFE).
  steps: decoding steps the loop ran, summed over the batches of different
    prompt-length buckets (each bucket decodes as its own batch).
  steps_B: decoding steps each row ran (a row stops once complete).
  logprobs_BxG: with generate(logprobs=True), each generated token's
    log-probability (model softmax) at the step it was committed (float32),
    for samplers that report it (DecodeState.logprob_BxN); else None.
  """

  texts: list[str] | None
  tokens_BxG: np.ndarray
  forwards_B: np.ndarray
  steps: int
  steps_B: np.ndarray
  logprobs_BxG: np.ndarray | None = None


def default_sampler(config: ModelConfig, **options: Any) -> Sampler:
  """The architecture's reference sampler built from keyword options."""
  return strategies.build_sampler(
      architectures.get(config.arch).default_strategy, config.arch, options)


def _pick_sampler(config: ModelConfig, strategy, sampler,
                  options: dict[str, Any]) -> Sampler:
  """The sampler `generate` runs: strategy name or object, sampler=, or the
  architecture's default, built from options."""
  if strategy is not None and sampler is not None:
    raise ValueError("pass strategy= or sampler=, not both")
  chosen = sampler if strategy is None else strategy
  if chosen is None:
    return default_sampler(config, **options)
  if isinstance(chosen, str):
    return strategies.build_sampler(chosen, config.arch, options)
  if options:
    raise ValueError(f"options {sorted(options)} given together with "
                     "sampler= (or a sampler object as strategy=)")
  return chosen


def unpack_model(model, config: ModelConfig | None = None, tokenizer=None):
  """(params, config, tokenizer) from what `load` returns, or from a params
  tree with config= (and tokenizer=)."""
  if isinstance(model, tuple) and len(model) == 3:
    params, config, tokenizer = model
  else:
    params = model
  if config is None:
    raise ValueError("pass config= (or the (params, config, tokenizer) that "
                     "load returns)")
  quantize.check_params(params, config)
  return params, config, tokenizer


def generate(model, prompt, *, strategy: str | Sampler | None = None,
             config: ModelConfig | None = None, tokenizer=None,
             sampler: Sampler | None = None, chat: bool | None = None,
             seed: int | Sequence[int] = 0,
             sampling: Sampling | Sequence[Sampling | None] | None = None,
             stop_at_eos: bool = True,
             batch_size: int | None = None, mesh=None,
             progress: Callable[[np.ndarray, int], None] | None = None,
             kernels: ops.Kernels | None = None, logprobs: bool = False,
             **options: Any) -> GenerateOutput:
  """Generates answers for one prompt or a batch.

  model: what `load` returns (params, config, tokenizer), or a params tree
    with `config=` (and `tokenizer=` for text).
  prompt: a string, a chat (list of {"role", "content"} messages), token
    ids, or a list of these (flash_dllm_jax/prompts.py). Prompts are
    left-padded to a multiple of PROMPT_BUCKET (less where that would not
    fit the model); each bucket present decodes as its own batch (see
    `bucket_groups`).
  strategy: a name from `flash_dllm_jax.strategies.STRATEGIES` (built from
    `options`: the sampler's fields, e.g. gen_length, steps, threshold), or
    a sampler object. Default: the architecture's reference sampler
    ("llada" or "dream"), built from `options`. `sampler=` is the same as
    passing a sampler object as `strategy`. temperature / top_p / top_k
    among `options` go where strategies.build_sampler puts them
    (diffusion-gemma: temperature onto its annealing, its family's
    `draw_options`).
  chat: apply the checkpoint's chat template to string prompts. None (the
    default, shared with the CLI): on when the tokenizer has a chat template.
    Chats are always rendered with the template.
  seed: one seed for every row, or one per row. A row's random draws come
    from its own seed only, so its answer never depends on the rest of the
    batch.
  sampling: a `Sampling` (temperature, top_p, top_k; threshold, factor,
    gamma) for every row, or one per row (row_sampling.py); None (for all,
    or for a row): the sampler's own options (greedy for samplers without
    them). A row's Sampling replaces the sampler's options it names in
    `row_fields` for that row: temperature / top_p / top_k drawn with the
    sampler's own rules (LLaDA: temperature only), threshold / factor /
    gamma in its rule where it runs that rule (row_options.py), and
    diffusion-gemma's canvas options (max_temperature, min_temperature,
    exponent, entropy_bound, max_out_length, early_stop, stop_tokens),
    else ValueError. Rows with different settings decode in one compiled
    program, and a row's tokens depend only on its prompt, settings and
    seed.
  stop_at_eos: a row stops once nothing before its first EOS/EOT is masked.
  batch_size: decode at most this many rows at a time. Samplers that can
    refill slots (`Refillable`; `strategies.refilling()`) use continuous
    batching (a finished slot takes the next prompt inside the compiled
    loop); the others decode fixed chunks one after another. The results
    equal one batch of all prompts. None: one batch.
  mesh: 'data=D,model=M' or a jax Mesh (parallel.parse_mesh): split the
    batch over D devices (padded to a multiple of D with copies of the last
    prompt, which are dropped) and the weights and KV cache over M
    (tensor parallelism; M must divide the heads, KV heads and MLP width).
    Weights not already on their shards (see `load(mesh=)`) are moved
    there.
  progress: called as progress(row indices just decoded, number of rows)
    after each decode call.
  kernels: kernel choice and settings (`ops.Kernels`; None: by backend,
    with the automatic attention split `ops.default_tiling()`), e.g.
    `ops.Kernels(attention=ops.Tiling(split_target=32))`, which never
    splits LLaDA-8B's keys: a little faster at batch 32, slower at batch 1
    (BENCHMARKS.md, "Hopper kernels"). Fixed per call, so a row's answer
    never depends on the batch.
  logprobs: also return each generated token's log-probability at the step
    it was committed (`GenerateOutput.logprobs_BxG`).
  """
  params, config, tokenizer = unpack_model(model, config, tokenizer)
  if kernels is not None and not isinstance(kernels, ops.Kernels):
    raise TypeError(f"kernels must be a flash_dllm_jax.ops.Kernels or None, "
                    f"got {type(kernels).__name__}")
  sampler = _pick_sampler(config, strategy, sampler, options)
  rows = prompts.token_rows(prompt, tokenizer, chat)
  for i, row in enumerate(rows):
    if why := checks.token_error(row, config.mask_token_id, config.vocab_size):
      raise ValueError(f"prompt {i} {why}")
  checks.check_lengths([len(r) for r in rows], sampler, config.max_seq_len)
  checks.check_seeds([seed] if np.ndim(seed) == 0 else list(seed))
  seeds = [seed] * len(rows) if np.ndim(seed) == 0 else list(seed)
  if len(seeds) != len(rows):
    raise ValueError(f"{len(seeds)} seeds for {len(rows)} prompts")
  row_sampling = row_settings(sampler, sampling, len(rows))
  row_options.check_rows(sampler, row_sampling)
  if batch_size is not None and batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  mesh = parallel.parse_mesh(mesh)
  parallel.check_config(config, mesh)
  if mesh is not None:
    params = parallel.shard_params(mesh, config, params)
  n_rows = len(rows)
  gen = np.zeros((n_rows, sampler.gen_length), np.int32)
  lp_all = np.zeros((n_rows, sampler.gen_length), np.float32)
  forwards, steps_b, steps = (np.zeros(n_rows, np.int32),
                              np.zeros(n_rows, np.int32), 0)
  room = config.max_seq_len - sampler.gen_length - tail_length(sampler)
  for chunk, n_slots in _chunks(bucket_groups(rows, room=room), sampler,
                              batch_size):
    out = decode_rows(params, [rows[i] for i in chunk],
                       [seeds[i] for i in chunk],
                       None if row_sampling is None
                       else [row_sampling[i] for i in chunk], config=config,
                       sampler=sampler, stop_at_eos=stop_at_eos,
                       batch_size=n_slots, mesh=mesh, kernels=kernels,
                       logprobs=logprobs)
    gen[chunk], forwards[chunk], steps_b[chunk] = out[:3]
    if logprobs:
      lp_all[chunk] = out[4]
    steps += out[3]
    if progress is not None:
      progress(chunk, n_rows)
  texts = None
  if tokenizer is not None:
    texts = [tokenizer.decode(answer_ids(row, config)) for row in gen]
  return GenerateOutput(texts, gen, forwards, steps, steps_b,
                        lp_all if logprobs else None)


def _chunks(groups: list[np.ndarray], sampler: Sampler,
            batch_size: int | None):
  """(row indices, continuous-batching slots or None) per decode call: a
  refillable sampler decodes each group through batch_size slots, any other
  sampler in consecutive chunks of at most batch_size rows."""
  refill = isinstance(sampler, Refillable)
  for group in groups:
    if batch_size is None or refill:
      yield group, batch_size
    else:
      for start in range(0, len(group), batch_size):
        yield group[start:start + batch_size], None


def answer_ids(gen_G: np.ndarray, config: ModelConfig) -> list[int]:
  """The generated ids up to (not including) the first stop token."""
  gen_G = np.asarray(gen_G)
  stops = np.flatnonzero(np.isin(gen_G, config.stop_token_ids))
  return gen_G[:stops[0] if stops.size else len(gen_G)].tolist()
