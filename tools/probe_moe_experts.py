"""How do the routed experts' two formulations compare on this backend?

  python tools/probe_moe_experts.py          # LLaDA2.0-mini's expert shapes
  python tools/probe_moe_experts.py --tiny   # a CPU-sized smoke run

ops/experts.py's dense path runs every expert on every row (C experts at a time) and each
(token, slot) pair takes its expert's row; the alternative sorts the pairs
by expert and runs jax.lax.ragged_dot. This prints, per token count T,
both formulations' milliseconds per MoE layer in bfloat16, whether
ragged_dot compiled to a dense dot over every group (no ragged-dot
instruction left in the optimized HLO) and the largest difference.
"""

from __future__ import annotations

import os
import sys
import time

X, K, E, M = 256, 8, 2048, 512  # experts, per token, model width, width
TOKENS = (32, 256, 1024, 4096)


def main() -> None:
  global X, K, E, M, TOKENS
  if "--tiny" in sys.argv:
    X, K, E, M, TOKENS = 8, 2, 64, 32, (16, 64)
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import jax
  import jax.numpy as jnp
  from flash_dllm_jax.ops import experts

  def dense(x, ids, stacks):
    return experts.dense_experts(x, ids, 0, stacks)

  def ragged(x, ids, stacks):
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.zeros((X,), jnp.int32).at[flat].add(1)
    dot = lambda a, w: jax.lax.ragged_dot(
        a, w[0], sizes, preferred_element_type=jnp.float32).astype(a.dtype)
    rows = x[order // K]
    h = jax.nn.silu(dot(rows, stacks[0])) * dot(rows, stacks[1])
    y = dot(h, stacks[2])
    return jnp.zeros_like(y).at[order].set(y).reshape(ids.shape[0], K, E)

  key = iter(jax.random.split(jax.random.key(0), 8))
  w = lambda i, o: (jax.random.normal(next(key), (X, i, o), jnp.float32)
                    * i ** -0.5).astype(jnp.bfloat16)
  stacks = ((w(E, M),), (w(E, M),), (w(M, E),))
  print(f"backend {jax.default_backend()}: X={X} K={K} E={E} M={M}")
  print("| T | dense ms | ragged_dot ms | ragged_dot dense in HLO | max diff |"
        "\n|---|---|---|---|---|")
  for t in TOKENS:
    x = jax.random.normal(next(key), (t, E), jnp.bfloat16)
    ids = jax.random.randint(next(key), (t, K), 0, X)
    times, outs = [], []
    for fn in (dense, ragged):
      compiled = jax.jit(fn).lower(x, ids, stacks).compile()
      outs.append(compiled(x, ids, stacks).block_until_ready())
      start = time.perf_counter()
      for _ in range(5):
        compiled(x, ids, stacks).block_until_ready()
      times.append((time.perf_counter() - start) / 5 * 1e3)
      if fn is ragged:
        lowered = "ragged-dot" not in compiled.as_text()
    diff = float(jnp.max(jnp.abs(outs[0].astype(jnp.float32)
                                 - outs[1].astype(jnp.float32))))
    print(f"| {t} | {times[0]:.2f} | {times[1]:.2f} | "
          f"{'yes' if lowered else 'no'} | {diff:.3g} |", flush=True)


if __name__ == "__main__":
  main()
