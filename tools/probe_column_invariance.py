"""Does a GEMM column's result depend on how many columns share the GEMM?

  python tools/probe_column_invariance.py        # XLA flags of the decode loops

Tensor parallelism splits a weight's output columns between devices, so each
device computes x @ W[:, shard] where one GPU computes x @ W. If XLA's GEMM
(cuBLAS under generate.GPU_COMPILER_OPTIONS) sums over K in another order for
the narrower N, the model's activations change bits and near-tied tokens
flip. For LLaDA-8B's and the shipped model's weight shapes, row counts M of
real decode steps and 2 or 4 column shards, this prints whether every shard's
columns equal the unsplit GEMM's bit for bit.
"""

from __future__ import annotations

import os
import sys

SHAPES = {  # name: (K, N)
    "8B q/o": (4096, 4096), "8B up": (4096, 12288), "8B down": (12288, 4096),
    "8B head": (4096, 126464),
    "12M q/o": (384, 384), "12M up": (384, 768), "12M down": (768, 384),
    "12M head": (384, 1024)}
MS = (1, 16, 17, 32, 128, 144, 1280, 1296, 4096, 4608, 40960)
SHARDS = (2, 4)


def main() -> None:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flash_dllm_jax.generate import GPU_COMPILER_OPTIONS
  options = GPU_COMPILER_OPTIONS if jax.default_backend() == "gpu" else None

  def dot(x, w):
    return jnp.einsum("me,eo->mo", x, w, preferred_element_type=jnp.float32
                      ).astype(x.dtype)

  compiled = {}

  def run(x, w):
    key = (x.shape, w.shape)
    if key not in compiled:
      compiled[key] = jax.jit(dot).lower(x, w).compile(options)
    return np.asarray(compiled[key](x, w).astype(jnp.float32))

  print(f"backend {jax.default_backend()}, options {options}")
  print("| shape | K x N | M | shards | equal columns |\n|---|---|---|---|---|")
  bad = 0
  for name, (k, n) in SHAPES.items():
    kx, kw = jax.random.split(jax.random.key(k * 7 + n))
    w = (jax.random.normal(kw, (k, n), jnp.float32) * k ** -0.5
         ).astype(jnp.bfloat16)
    for m in MS:
      x = jax.random.normal(kx, (m, k), jnp.bfloat16)
      full = run(x, w)
      for s in SHARDS:
        width = n // s
        parts = [run(x, w[:, i * width:(i + 1) * width]) for i in range(s)]
        equal = np.array_equal(np.concatenate(parts, 1), full)
        bad += not equal
        print(f"| {name} | {k} x {n} | {m} | {s} | "
              f"{'yes' if equal else 'NO'} |", flush=True)
  print(f"COLUMN_INVARIANT={'yes' if bad == 0 else 'no'} ({bad} differ)")


if __name__ == "__main__":
  main()
