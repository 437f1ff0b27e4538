"""How many slots of which prompt capacity the server runs, in vLLM's mould
(`gpu_memory_utilization`): the memory the server may use (the server
sets JAX's allocator to that fraction of the device: XLA_PYTHON_CLIENT_
MEM_FRACTION, unless already set), less the weights and the decode
program's workspace, divided by what one slot holds.

A slot holds its KV cache (every layer's keys and values over prompt +
canvas positions, in the sampler's kv_cache_dtype: an 8-bit cache holds
half the bytes, plus its scales), its per-position loop state and what the
sampler keeps per position beside them (Elastic-Cache: every layer's input). The
workspace is what a step needs beside them whatever the slot count: one
prefill group's cache rows and activations (fresh rows prefill
max_refills at a time, flash_forward.prefill_rows) and a margin. Both are estimates from the
shapes, not a measurement; the bench's peak memory rows (BENCHMARKS.md,
"Memory") are what they are checked against.

`plan_slots` is a pure function of its inputs, so the tests give it a
budget; the server gives it the allocator's `bytes_limit`.
"""

from __future__ import annotations

import dataclasses

import jax

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model.cache import cache_bytes
from flash_dllm_jax.prompts import PROMPT_BUCKET

DEFAULT_UTILIZATION = 0.9
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# per-position loop state of a row (tokens, masks, ranks, confidences,
# log-probabilities, ...), generously
_STATE_BYTES_PER_POSITION = 64
# rows a prefill group runs when the sampler does not say (max_refills)
_DEFAULT_GROUP = 4
_MARGIN_BYTES = 1 << 30  # the allocator's slack, small buffers, the program


@dataclasses.dataclass(frozen=True)
class SlotPlan:
  """slots of max_prompt_tokens each; the numbers they came from (bytes;
  budget None where the device reports no memory limit) and why."""

  slots: int
  max_prompt_tokens: int
  budget_bytes: int | None
  weight_bytes: int
  workspace_bytes: int
  slot_bytes: int
  reason: str

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def longest_prompt(config: ModelConfig, sampler, tail: int = 0) -> int:
  """The longest prompt a slot can hold: the context less the canvas
  (gen_length + tail), down to a multiple of PROMPT_BUCKET (slots hold
  whole buckets)."""
  room = config.max_seq_len - sampler.gen_length - tail
  return room // PROMPT_BUCKET * PROMPT_BUCKET


def slot_bytes(config: ModelConfig, positions: int,
               kv_cache_dtype: str = "auto") -> int:
  """Bytes one slot of `positions` positions holds: its KV cache rows (in
  the sampler's kv_cache_dtype) and its loop state."""
  return (cache_bytes(config, positions, kv_cache_dtype)
          + positions * _STATE_BYTES_PER_POSITION)


def _kv_dtype(sampler) -> str:
  return getattr(sampler, "kv_cache_dtype", "auto")


def sampler_slot_bytes(config: ModelConfig, sampler, positions: int) -> int:
  """slot_bytes plus what the sampler keeps per position beside the cache
  (`stored_bytes_per_position`, e.g. Elastic-Cache's stored layer inputs)."""
  stored = getattr(sampler, "stored_bytes_per_position", None)
  return (slot_bytes(config, positions, _kv_dtype(sampler))
          + (0 if stored is None else positions * stored(config)))


def workspace_bytes(config: ModelConfig, sampler, positions: int) -> int:
  """A step's memory beside the slots, whatever their number: one prefill
  group (its cache rows and float32 activations: the residual stream, the
  attention's and the MLP's widest tensors, a few of each live) and a
  margin."""
  group = getattr(sampler, "max_refills", None) or _DEFAULT_GROUP
  widest = max(config.mlp_hidden, config.n_heads * config.head_dim,
               config.d_model)
  activations = group * positions * 4 * (3 * widest + 4 * config.d_model)
  return (group * sampler_slot_bytes(config, sampler, positions)
          + activations + _MARGIN_BYTES)


def check_utilization(utilization: float) -> None:
  if not 0 < utilization <= 1:
    raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got "
                     f"{utilization}")


def plan_slots(config: ModelConfig, sampler, *, weight_bytes: int,
               budget_bytes: int | None, slots: int | None = None,
               max_prompt_tokens: int | None = None, tail: int = 0,
               data_devices: int = 1, fallback_slots: int = 8) -> SlotPlan:
  """The slot pool: max_prompt_tokens (default: the longest prompt the
  model fits) and slots (default: as many as fit the budget on each of
  the data_devices). budget_bytes: the memory one device may use (None:
  unknown, e.g. the CPU; then `fallback_slots` unless slots is given).
  Under a data mesh each device holds slots / data_devices of them and
  all the weights (an upper bound under tensor parallelism). ValueError,
  naming the numbers, when the capacity does not fit the model or not one
  slot fits."""
  top = longest_prompt(config, sampler, tail)
  if top < 1:
    raise ValueError(f"gen_length {sampler.gen_length} leaves no room for "
                     f"a prompt in max_seq_len {config.max_seq_len}")
  if max_prompt_tokens is None:
    prompt, why = top, (f"prompts up to {top} tokens: the context "
                        f"{config.max_seq_len} less the canvas")
  else:
    prompt, why = max_prompt_tokens, f"prompts up to {max_prompt_tokens} tokens"
  if prompt < 1:
    raise ValueError(f"--max-prompt-tokens must be >= 1, got {prompt}")
  positions = -(-prompt // PROMPT_BUCKET) * PROMPT_BUCKET + (
      sampler.gen_length + tail)
  per_slot = sampler_slot_bytes(config, sampler, positions)
  work = workspace_bytes(config, sampler, positions)
  budget = budget_bytes
  if slots is not None:
    return SlotPlan(slots, prompt, budget, weight_bytes, work, per_slot,
                    f"{why}; {slots} slots as --batch-size asks")
  if budget is None:
    return SlotPlan(fallback_slots, prompt, None, weight_bytes, work,
                    per_slot, f"{why}; {fallback_slots} slots: the device "
                    "reports no memory limit")
  free = budget - weight_bytes - work
  fit = max(free, 0) // per_slot * data_devices  # each device's share
  gib = lambda x: f"{x / 2**30:.1f} GiB"
  if fit < 1:
    raise ValueError(
        f"not one slot of {positions} positions ({gib(per_slot)}) fits "
        f"{gib(budget)} less the weights' {gib(weight_bytes)} and the "
        f"workspace's {gib(work)}; lower --max-prompt-tokens or raise "
        "--gpu-memory-utilization")
  return SlotPlan(int(fit), prompt, budget, weight_bytes, work, per_slot,
                  f"{why}; {fit} slots of {gib(per_slot)} fit {gib(budget)} "
                  f"after the weights' {gib(weight_bytes)} and the "
                  f"workspace's {gib(work)}")


def allocator_bytes() -> int | None:
  """The first local device's allocator limit (None where the backend
  keeps no memory stats)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")
