"""Does a row's matmul result depend on how many rows share the matmul?

  python tools/probe_batch_invariance.py            # every flag set below
  python tools/probe_batch_invariance.py --sets 3 6   # the 3rd and 6th only
  python tools/probe_batch_invariance.py --child    # one set, XLA_FLAGS as set
  python tools/probe_batch_invariance.py --sets 4 --quantize
      # the 8-bit GEMMs (pallas_kernels/qmatmul, each kernel and format)

On a GPU, XLA picks a GEMM algorithm (split-K, cuBLAS or Triton tiles) per
shape, so the bfloat16 result of row 0 of x @ W can change with M, the rows
in the batch, and near-tied tokens flip when a batch is split differently
(over data-parallel devices, into prompt-length buckets, or by continuous
batching). Each XLA flag set runs in a child process (XLA reads XLA_FLAGS
once) and reports, per weight shape, for how many M in MS row 0 equals the
M = 16 result bit for bit (a decode step runs at least 16 rows; M = 1 takes
a matrix-vector path), and the time of x @ W at M = 144 and 4608 (a
Flash-Cache step's rows at batch 1 and 32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pallas_kernels

MS = (16, 32, 48, 64, 96, 128, 144, 160, 256, 512, 1024, 1296, 2048, 4096,
      4608)
SHAPES = ((384, 1152), (768, 384), (4096, 12288), (12288, 4096))
FLAG_SETS = {
    "default": "",
    "autotune 0": "--xla_gpu_autotune_level=0",
    "no triton gemm": "--xla_gpu_enable_triton_gemm=false",
    "no triton gemm, autotune 0": "--xla_gpu_enable_triton_gemm=false "
                                  "--xla_gpu_autotune_level=0",
    "deterministic ops": "--xla_gpu_deterministic_ops=true",
    "no split-k autotuning": "--xla_gpu_enable_split_k_autotuning=false",
    "cuBLASLt, autotune 0": "--xla_gpu_enable_triton_gemm=false "
                            "--xla_gpu_autotune_level=0 "
                            "--xla_gpu_enable_cublaslt=true",
}
TIMED_MS = (144, 4608)
# --quantize: fewer M (a Pallas kernel compiles per M), the shipped model's
# two weight shapes and LLaDA-8B's two large ones.
QUANTIZED_MS = (16, 64, 144, 512, 1024, 4608)
QUANTIZED_SHAPES = ((384, 1152), (768, 384), (4096, 12288), (12288, 4096))


# 8-bit GEMMs: (name, weight dtype, scale group or None, activations, impl)
QUANTIZED = (("fp8 W8A8 xla", "float8_e4m3fn", None, "fp8", "xla"),
             ("fp8 W8A8 pallas", "float8_e4m3fn", None, "fp8", "pallas"),
             ("int8 xla", "int8", None, "bf16", "xla"),
             ("int8 pallas", "int8", None, "bf16", "pallas"),
             ("int8-g128 pallas", "int8", 128, "bf16", "pallas"),
             ("int8-g128 xla", "int8", 128, "bf16", "xla"))


def _gemms(quantize: bool):
  """(label, jitted dot(x, w), w) makers per weight [E, N] float32."""
  import jax
  import jax.numpy as jnp
  if not quantize:
    dot = jax.jit(lambda x, w: jnp.einsum("me,eo->mo", x, w,
                                          preferred_element_type=jnp.float32
                                          ).astype(x.dtype))
    yield "bf16", dot, lambda w: w.astype(jnp.bfloat16)
    return
  from pallas_kernels.qmatmul import api

  def quantized(dtype, group, w_ExO):
    w_OxE = w_ExO.T
    o, e = w_OxE.shape
    g = w_OxE.reshape(o, e // (group or e), group or e)
    top = 448.0 if dtype == "float8_e4m3fn" else 127.0
    scale = jnp.max(jnp.abs(g), -1) / top
    q = g / scale[..., None]
    q = jnp.round(q) if dtype == "int8" else q
    return q.astype(dtype).reshape(o, e), scale

  for label, dtype, group, act, impl in QUANTIZED:
    dot = jax.jit(lambda x, w, act=act, impl=impl: api.matmul(
        x, *w, activations=act, implementation=impl))
    yield label, dot, lambda w, d=dtype, g=group: quantized(d, g, w)


def child(quantize: bool = False) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  global MS
  MS = QUANTIZED_MS if quantize else MS
  out = {}
  for (e, n), (label, dot, prep) in (
      (shape, g) for shape in (QUANTIZED_SHAPES if quantize else SHAPES)
      for g in _gemms(quantize)):
    kx, kw = jax.random.split(jax.random.key(e * 7 + n))
    x = jax.random.normal(kx, (max(MS), e), jnp.bfloat16)
    w = prep(jax.random.normal(kw, (e, n), jnp.float32) * e ** -0.5)
    first = {m: np.asarray(dot(x[:m], w)[0].astype(jnp.float32)) for m in MS}
    same = [m for m in MS if np.array_equal(first[m], first[MS[0]])]
    times = {}
    for m in TIMED_MS:
      xs = x[:m]
      dot(xs, w).block_until_ready()
      t0 = time.perf_counter()
      for _ in range(20):
        y = dot(xs, w)
      y.block_until_ready()
      times[m] = (time.perf_counter() - t0) / 20 * 1e6
    out[f"{e}x{n}" + ("" if label == "bf16" else f" {label}")] = {
        "same_as_first": same, "us": times}
  return out


def main() -> None:
  quantize = "--quantize" in sys.argv
  if "--child" in sys.argv:
    print("RESULT " + json.dumps(child(quantize)))
    return
  best, best_same = "", -1
  names = list(FLAG_SETS)
  if "--sets" in sys.argv:  # 1-based indices into FLAG_SETS
    picked = [int(a) for a in sys.argv[sys.argv.index("--sets") + 1:]
              if a.isdigit()]
    if not picked or not all(1 <= i <= len(names) for i in picked):
      raise SystemExit(f"--sets takes 1-based indices into {names}")
    names = [names[i - 1] for i in picked]
  ms = QUANTIZED_MS if quantize else MS
  print("| flags | shape | M with row 0 = M=16 (of %d) | differs at M | "
        "µs M=%d | µs M=%d |\n|---|---|---|---|---|---|" % (len(ms), *TIMED_MS))
  for name in names:
    flags = FLAG_SETS[name]
    env = dict(os.environ, XLA_FLAGS=flags)
    proc = subprocess.run([sys.executable, __file__, "--child"]
                          + ["--quantize"] * quantize, env=env,
                          capture_output=True, text=True, timeout=240)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not line:
      tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
      print(f"| {name} | - | failed: {tail} | | | |")
      continue
    result = json.loads(line[0][7:])
    same = sum(len(r["same_as_first"]) for r in result.values())
    if same > best_same:
      best, best_same = flags, same
    for shape, r in result.items():
      differ = [m for m in ms if m not in r["same_as_first"]]
      print(f"| {name} | {shape} | {len(r['same_as_first'])} | "
            f"{' '.join(map(str, differ)) or '-'} | "
            f"{r['us'][str(TIMED_MS[0])]:.1f} | "
            f"{r['us'][str(TIMED_MS[1])]:.1f} |", flush=True)
  print(f"BEST_FLAGS={best}")


if __name__ == "__main__":
  main()
