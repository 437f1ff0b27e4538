"""How the decode loops compile: batch-invariant XLA options per backend,
and JAX's persistent compilation cache for the command lines."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import jax

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
# alone did not (BENCHMARKS.md, "Batch invariance", with its cost in the
# step): measured, not a promise from XLA. XLA's dot merger joined k_proj
# and v_proj into one GEMM by concatenating their weights in every layer of
# every pass, and only below a size, so the GEMM shapes also depended on the
# number of rows: off.
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
  current default backend. One jitted function per backend and options, so
  a change to those dicts (the CPU test suite raises the optimisation level
  for its compute-heavy modules) takes effect at the next call."""

  def __init__(self, fn, static_argnames: tuple[str, ...]):
    self._fn, self._static = fn, static_argnames
    self._jitted_by: dict[tuple, Any] = {}
    self.__doc__, self.__wrapped__ = fn.__doc__, fn

  def _jitted(self):
    backend = jax.default_backend()  # chosen at call time, never at import
    options = compiler_options(backend)
    key = (backend, tuple(sorted((options or {}).items())))
    if key not in self._jitted_by:
      self._jitted_by[key] = jax.jit(
          self._fn, static_argnames=self._static, compiler_options=options)
    return self._jitted_by[key]

  def __call__(self, *args, **kwargs):
    return self._jitted()(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted(), name)


CACHE_ENV = "FLASH_DLLM_JAX_CACHE_DIR"
_OFF = ("", "0", "off", "none", "false")


def default_cache_dir() -> Path | None:
  """$FLASH_DLLM_JAX_CACHE_DIR (off, 0 or empty: no cache), else
  $XDG_CACHE_HOME/flash-dllm-jax/jax (XDG_CACHE_HOME defaults to ~/.cache)."""
  value = os.environ.get(CACHE_ENV)
  if value is not None:
    return None if value.strip().lower() in _OFF else Path(value).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "flash-dllm-jax" / "jax"


def enable_persistent_cache(cache_dir: str | Path | None) -> Path | None:
  """Turns on JAX's persistent compilation cache in `cache_dir` (None: off),
  so a second run of the same command loads its compiled decode loops from
  disk instead of compiling them. Every executable is cached, however fast
  its compile. Call before anything is compiled; returns the directory."""
  if cache_dir is None:
    return None
  path = Path(cache_dir).expanduser().absolute()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ValueError(f"cannot create the compilation cache {path}: "
                     f"{e.strerror} (set {CACHE_ENV}=off to run without "
                     "one)") from None
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration")
# Wraps compile_or_get_cached: a fresh compile or a persistent-cache load.
_BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILE_EVENTS = (*_TRACE_EVENTS, _BACKEND_EVENT)
# Recorded inside compile_or_get_cached, before its _BACKEND_EVENT ends
# (jax 0.10 and 0.11).
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@contextlib.contextmanager
def compile_clock() -> Iterator[list[float]]:
  """Yields [seconds]: time JAX spends tracing/compiling inside the block."""
  total = [0.0]

  def listener(event: str, duration: float, **_):
    if event in _COMPILE_EVENTS:
      total[0] += duration

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield total
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


class CompileLog:
  """What JAX did to get the programs run inside `compile_log()`: seconds
  tracing and lowering, and per backend program whether XLA compiled it or
  it was loaded from the persistent compilation cache (with the seconds of
  each). Programs already compiled in this process count in neither."""

  def __init__(self):
    self.trace_s = self.compile_s = self.load_s = 0.0
    self.compiled = self.loaded = 0
    self._hits = 0

  def _on_event(self, event: str, **_) -> None:
    if event == _CACHE_HIT_EVENT:
      self._hits += 1

  def _on_duration(self, event: str, duration: float, **_) -> None:
    if event in _TRACE_EVENTS:
      self.trace_s += duration
    elif event == _BACKEND_EVENT and self._hits:
      self._hits -= 1
      self.loaded, self.load_s = self.loaded + 1, self.load_s + duration
    elif event == _BACKEND_EVENT:
      self.compiled += 1
      self.compile_s += duration

  def spent(self) -> float:
    """Seconds spent so far tracing, compiling and loading programs."""
    return self.trace_s + self.compile_s + self.load_s

  def describe(self, total_s: float, rest: str = "decoding") -> str:
    """'5.07 s: 0.41 s tracing, 3.79 s compiling 4 programs, 0.87 s
    decoding' (or 'loading 4 programs from the compilation cache')."""
    def n(k: int) -> str:
      return f"{k} program{'s' if k != 1 else ''}"
    parts = [f"{self.trace_s:.2f} s tracing"]
    if self.compiled:
      parts.append(f"{self.compile_s:.2f} s compiling {n(self.compiled)}")
    if self.loaded:
      parts.append(f"{self.load_s:.2f} s loading {n(self.loaded)} from the "
                   "compilation cache")
    if not (self.compiled or self.loaded):
      parts.append("no program compiled or loaded")
    spent = self.spent()
    parts.append(f"{max(total_s - spent, 0.0):.2f} s {rest}")
    return f"{total_s:.2f} s: " + ", ".join(parts)


@contextlib.contextmanager
def compile_log() -> Iterator[CompileLog]:
  """Yields a CompileLog filled by JAX's monitoring events in the block."""
  log = CompileLog()
  on_event, on_duration = log._on_event, log._on_duration
  jax.monitoring.register_event_listener(on_event)
  jax.monitoring.register_event_duration_secs_listener(on_duration)
  try:
    yield log
  finally:
    jax.monitoring.unregister_event_listener(on_event)
    jax.monitoring.unregister_event_duration_listener(on_duration)
