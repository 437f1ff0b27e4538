"""Device timing and the two ceilings every benchmark is compared to."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp


def time_fn(fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> float:
  """Median wall seconds of fn() with results blocked on (already compiled)."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def copy_bandwidth(gib: float = 4.0, reps: int = 20) -> float:
  """Device-to-device copy rate in bytes/s, counting bytes read + written."""
  n = int(gib * 2**30) // 4
  x = jax.random.uniform(jax.random.key(0), (n,), jnp.float32)
  copy = jax.jit(lambda a: a * 1.0000001)
  seconds = time_fn(lambda: copy(x), reps=reps)
  return 2 * n * 4 / seconds


def matmul_rate(n: int = 8192, reps: int = 20) -> float:
  """bf16 dense matmul FLOP/s on random data."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda x, y: x @ y)
  seconds = time_fn(lambda: mm(a, b), reps=reps)
  return 2 * n**3 / seconds


def peak_memory_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")
