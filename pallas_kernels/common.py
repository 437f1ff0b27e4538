"""Helpers shared by the kernel folders: backend choice and tile sizes."""

import jax

IMPLEMENTATIONS = ("pallas", "pallas_interpret", "reference")


def on_gpu() -> bool:
  """True on a CUDA/ROCm default backend (named 'gpu' or 'cuda' by version)."""
  return jax.default_backend() in ("gpu", "cuda", "rocm")


def resolve_implementation(implementation: str | None,
                           allowed: tuple[str, ...] = IMPLEMENTATIONS) -> str:
  """None picks 'pallas' on a GPU backend and 'reference' elsewhere; a name
  must be one of `allowed` (a kernel folder may add its own, e.g. 'xla')."""
  if implementation is None:
    return "pallas" if on_gpu() else "reference"
  if implementation not in allowed:
    raise ValueError(f"implementation must be one of {allowed} or "
                     f"None, got {implementation!r}")
  return implementation


def next_pow2(n: int) -> int:
  """Smallest power of two >= n (Triton tiles must be powers of two)."""
  return 1 << max(0, int(n) - 1).bit_length()


def is_pow2(n: int) -> bool:
  return n > 0 and (n & (n - 1)) == 0
