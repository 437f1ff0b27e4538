"""The most rows of a decode or likelihood batch that fit in memory.

An estimate, per row of L positions (compute dtype itemsize s):
  logits     L * vocab * 4 * 2   (float32 logits and their softmax)
  KV cache   L * 2 * layers * kv_heads * head_dim * s
  a layer    L * (4 * d_model + (heads + 2 * kv_heads) * head_dim
                  + 3 * mlp_hidden) * s   (residual, q/k/v, MLP)
against the free memory: the first local device's bytes_limit minus its
bytes_in_use (the weights included) where the backend reports them, else
the host's available memory (CPU), times HEADROOM for XLA's workspace.
lm-eval's batch_size=auto clips to what fits; so does an explicit batch
size here, with one warning line naming the sizes.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp

from flash_dllm_jax.model.cache import cache_bytes

HEADROOM = 0.8  # of the free memory, for the batch's arrays

log = logging.getLogger(__name__)


def row_bytes(config, length: int, kv_cache_dtype: str = "auto") -> int:
  """Estimated peak bytes one row of `length` positions holds (above; the
  KV cache in the sampler's kv_cache_dtype, model/cache.py)."""
  s = jnp.dtype(config.dtype).itemsize
  per_position = (config.vocab_size * 4 * 2
                  + cache_bytes(config, 1, kv_cache_dtype)
                  + (4 * config.d_model
                     + (config.n_heads + 2 * config.n_kv_heads)
                     * config.head_dim + 3 * config.mlp_hidden) * s)
  return int(length * per_position)


def free_bytes() -> tuple[int, str]:
  """(bytes free, where): the first local device's, else the host's."""
  device = jax.local_devices()[0]
  stats = device.memory_stats() or {}
  if "bytes_limit" in stats:
    return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
            f"free on {device.device_kind}")
  pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return int(pages), "host memory available"


def fitting_rows(config, length: int, budget: int,
                 kv_cache_dtype: str = "auto") -> int:
  """The most rows of `length` positions within `budget` bytes (>= 1:
  one row always runs)."""
  return max(1, int(budget * HEADROOM) // max(
      1, row_bytes(config, length, kv_cache_dtype)))


class BatchBound:
  """Clips batch sizes to the memory (memory_gib, else `free_bytes`),
  warning once per (what, size, clipped size)."""

  def __init__(self, config, memory_gib: float | None = None,
               kv_cache_dtype: str = "auto"):
    self.config, self.kv_cache_dtype = config, kv_cache_dtype
    if memory_gib is None:
      self.budget, self.where = free_bytes()
    else:
      self.budget, self.where = int(memory_gib * 2**30), "memory_gib"
    self._warned: set[tuple[str, int, int]] = set()

  def rows(self, what: str, wanted: int, length: int, copies: int = 1
           ) -> int:
    """min(wanted, the rows of `length` positions that fit), each row
    holding `copies` sequences (2 with classifier-free guidance)."""
    fit = max(1, fitting_rows(self.config, length, self.budget,
                              self.kv_cache_dtype) // copies)
    if fit >= wanted:
      return wanted
    if (what, wanted, fit) not in self._warned:
      self._warned.add((what, wanted, fit))
      per_row = row_bytes(self.config, length, self.kv_cache_dtype) * copies
      log.warning("flash_dllm_jax: %s batch_size %d clipped to %d rows: "
                  "about %.1f MiB per row of %d positions, %.2f GiB %s",
                  what, wanted, fit, per_row / 2**20, length,
                  self.budget / 2**30, self.where)
    return fit
