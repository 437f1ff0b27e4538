"""The 8-bit-weight matmul table of scripts/bench_kernels.py (--qmatmul).

At LLaDA-8B's projection shapes (q/k/v/o 4096 -> 4096, gate+up+SwiGLU
4096 -> 2 x 12288, down+residual 12288 -> 4096) and M rows, it times the
bf16 XLA dot (weight [E, O], the baseline) and pallas_kernels/qmatmul's
formats: the weight-streaming kernels ('pallas', Triton, and 'mosaic',
Mosaic GPU's TMA + wgmma kernel for weight-only formats; a few tilings
each, the fastest kept) and XLA's dots ('xla': W8A8 through cuBLASLt's fp8 GEMM,
int8 converted in the jit). Each row: median time, bytes moved at least and
GB/s against the copy rate, TFLOP/s against the bf16 or fp8 matmul rate
(all three ceilings measured in the same run), bf16's time / this time, and
the max |error| against the format's float32 reference. Writes the JSON
(rewritten after every row) and a markdown table.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from flash_dllm_bench.kernel_bench import (copy_bandwidth, max_err, stateless,
                                           timeit)
from flash_dllm_bench.timing import matmul_rate
from pallas_kernels.qmatmul import api, kernel, reference
from pallas_kernels.qmatmul.reference import FP8

# name: (weight dtype, group, activations); None: the bf16 baseline.
FORMATS = {"bf16": None, "int8": (jnp.int8, None, "bf16"),
           "int8_g128": (jnp.int8, 128, "bf16"), "fp8": (FP8, None, "bf16"),
           "fp8_w8a8": (FP8, None, "fp8")}
VARIANTS = [("bf16", "xla"), ("int8", "pallas"), ("int8_g128", "pallas"),
            ("fp8", "pallas"), ("fp8_w8a8", "pallas"), ("fp8_w8a8", "xla"),
            ("int8", "xla"), ("int8", "mosaic"), ("fp8", "mosaic")]
# Mosaic GPU tilings (mosaic.matmul): the weight tile [block_o, block_e]
# and the E splits; rows go in wgmma tiles of block_m = 16.
SWEEP_MOSAIC = [{}, dict(block_o=128), dict(block_e=256),
                dict(block_o=128, block_e=256), dict(split_e=1),
                dict(block_o=128, split_e=2), dict(block_e=64)]
# Tilings tried per kernel row, one knob changed at a time from the
# kernel's default: the column tile and E split for few rows, the row tile
# for many (the kernel's own tiles never depend on M; a caller picks them).
SWEEP_FEW = [{}, dict(block_n=128), dict(split_e=2), dict(split_e=1),
             dict(block_n=32), dict(num_warps=8), dict(block_e=256),
             dict(block_n=128, num_warps=8)]
# A pass of 65-256 rows (the Flash-dLLM draft pass at batch 1): one or two
# row tiles, so the weight is read about once.
SWEEP_WIDE = [dict(block_m=128, num_warps=8), dict(block_m=64),
              dict(block_m=64, num_warps=8), dict(block_m=128),
              dict(block_m=256, num_warps=8),
              dict(block_m=128, block_n=128, num_warps=8),
              dict(block_m=128, num_warps=8, split_e=1),
              dict(block_m=64, block_n=128), {}]
SWEEP_MANY = [{}, dict(block_m=64), dict(block_m=64, block_n=128),
              dict(block_m=32), dict(block_m=64, num_warps=8),
              dict(block_m=128, num_warps=8), dict(split_e=1)]


def fp8_matmul_rate(n: int = 8192, reps: int = 20) -> float:
  """e4m3 x e4m3 -> float32 FLOP/s, both [n, n] contracting dims 1 (the
  layout XLA sends to cuBLASLt's fp8 GEMM)."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(FP8)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(FP8)
  mm = jax.jit(lambda x, y: jax.lax.dot_general(
      x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32))
  jax.block_until_ready(mm(a, b))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(mm(a, b))
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / statistics.median(times)


def shapes(e, f):
  """name: (E in, O out, epilogue)."""
  return {"qkvo": (e, e, "plain"), "gate_up_swiglu": (e, f, "swiglu"),
          "down+res": (f, e, "residual")}


def _operands(e, o, epilogue, m, fmt):
  """(x, weight args, epilogue kwargs) of one shape in one format."""
  ks = jax.random.split(jax.random.key(m + o), 4)
  x = jax.random.normal(ks[0], (m, e), jnp.bfloat16)
  w = [jax.random.normal(k, (o, e), jnp.float32) * e ** -0.5
       for k in ks[1:1 + (1 + (epilogue == "swiglu"))]]
  kw = {}
  if epilogue == "residual":
    kw["residual_MxO"] = jax.random.normal(ks[3], (m, o), jnp.bfloat16)
  if FORMATS[fmt] is None:  # bf16 [E, O]
    w = [wi.T.astype(jnp.bfloat16) for wi in w]
    return x, w, kw
  dtype, group, activations = FORMATS[fmt]
  q = [reference.quantize(wi, dtype, group) for wi in w]
  if len(q) == 2:
    kw["w_up_OxE"], kw["scale_up_OxZ"] = q[1]
  return x, list(q[0]), dict(kw, activations=activations)


def _bf16(x, w_ExO, w_up_ExO=None, residual_MxO=None, precision=None):
  dot = lambda w: jnp.dot(x, w, preferred_element_type=jnp.float32,
                          precision=precision)
  y = dot(w_ExO)
  if w_up_ExO is not None:
    y = jax.nn.silu(y) * dot(w_up_ExO)
  if residual_MxO is not None:
    y = y + residual_MxO.astype(jnp.float32)
  return y.astype(x.dtype)


def _bytes(e, o, m, epilogue, fmt, z):
  n_w = 2 if epilogue == "swiglu" else 1
  w = n_w * e * o * (2 if fmt == "bf16" else 1) + (
      0 if fmt == "bf16" else n_w * o * z * 4)
  return w + 2 * m * e + 2 * m * o * (2 if epilogue == "residual" else 1)


def _configs(fmt, m, e, o, limit, impl="pallas"):
  """The first `limit` distinct tilings (split_e resolved to compare)."""
  if FORMATS[fmt] is None:
    return []
  if impl == "mosaic":
    return SWEEP_MOSAIC[:limit]
  grouped = FORMATS[fmt][1] is not None
  out, seen = [], set()
  for c in (SWEEP_FEW if m <= 64 else SWEEP_WIDE if m <= 256 else
            SWEEP_MANY):
    bn, be = c.get("block_n", 64), c.get("block_e", 128)
    full = dict(block_m=16, num_warps=4, block_n=bn, block_e=be,
                split_e=kernel.default_split(o, e, bn, be))
    full.update(c)
    key = tuple(sorted(full.items()))
    if not (grouped and be != 128) and key not in seen:
      seen.add(key)
      out.append(c)
  return out[:limit]


def table(data):
  """The markdown table of a results dict (header lines, then rows)."""
  c = data["ceilings"]
  out = [f"{data['device']} · jax {data['jax']} · copy "
         f"{c['copy_gb_s']:.4g} GB/s · bf16 matmul {c['bf16_tflop_s']:.4g} "
         f"TFLOP/s · fp8 matmul {c['fp8_tflop_s']:.4g} TFLOP/s", "",
         "| shape | M | format | impl | best tiling | µs | default µs | GB/s |"
         " of copy | TFLOP/s | of matmul | bf16 µs / µs | max err |",
         "|" + "---|" * 13]
  for r in data["rows"]:
    out.append(
        f"| {r['shape']} | {r['m']} | {r['format']} | {r['impl']} | "
        f"{r['tiling'] or '-'} | {r['us']:.1f} | "
        f"{r['default_us']:.1f} | {r['gb_s']:.4g} | "
        f"{r['frac_copy']:.2f} | {r['tflop_s']:.4g} | {r['frac_matmul']:.2f}"
        f" ({r['ceiling']}) | {r['vs_bf16']:.2f} | {r['max_err']:.3g} |")
  return "\n".join(out)


def _sweep(time_it, x, w, kw, configs, interpret, impl="pallas"):
  """(seconds, output, tiling label, every config tried) of the fastest
  kernel tiling; (None, None, "", tried) when none ran. The kernel is
  called itself, so what it does not take is an error here, never a
  fall-through timed under its name."""
  best, out, tiling, tried = None, None, "", []
  if impl == "mosaic":
    from pallas_kernels.qmatmul import mosaic
    matmul = mosaic.matmul
  else:
    matmul = kernel.matmul
  for cfg in configs:
    try:
      t, o = time_it(functools.partial(
          matmul, **kw, interpret=interpret, **cfg), x, *w)
    except Exception as ex:  # noqa: BLE001  an unsupported tiling
      tried.append(dict(cfg, error=f"{type(ex).__name__}: {ex}"[:200]))
      continue
    tried.append(dict(cfg, us=t * 1e6))
    if best is None or t < best:
      best, out = t, o
      tiling = " ".join(f"{k}={v}" for k, v in cfg.items()) or "default"
  return best, out, tiling, tried


def _time_variant(time_it, x, w, kw, fmt, impl, configs, interpret):
  """(seconds or None, output, reference output, tiling, tried) of a row."""
  if fmt == "bf16":
    bkw = dict(w_up_ExO=w[1] if len(w) > 1 else None,
               residual_MxO=kw.get("residual_MxO"))
    t, out = time_it(functools.partial(_bf16, **bkw), x, w[0])
    return t, out, _bf16(x, w[0], **bkw, precision="highest"), "", []
  want = reference.matmul(x, *w, **kw)
  if impl == "xla":
    t, out = time_it(functools.partial(api.matmul, **kw,
                                       implementation="xla"), x, *w)
    return t, out, want, "", []
  t, out, tiling, tried = _sweep(time_it, x, w, kw, configs, interpret, impl)
  return t, out, want, tiling, tried


def _row(data, name, ein, o, epilogue, m, fmt, impl, t, t_bf16, err,
         tiling, tried, z):
  """One results row: time, bytes and FLOPs against the run's ceilings."""
  c = data["ceilings"]
  nbytes = _bytes(ein, o, m, epilogue, fmt, z)
  flops = 2 * m * ein * o * (2 if epilogue == "swiglu" else 1)
  ceiling = "fp8" if fmt == "fp8_w8a8" else "bf16"
  rate, bw = c[f"{ceiling}_tflop_s"] * 1e12, c["copy_gb_s"] * 1e9
  return dict(shape=f"{name} {ein}x{o}", m=m, format=fmt, impl=impl,
              tiling=tiling, us=t * 1e6, bytes=nbytes,
              default_us=tried[0].get("us", float("nan")) if tried else (
                  t * 1e6),
              gb_s=nbytes / t / 1e9, frac_copy=nbytes / t / bw, flops=flops,
              tflop_s=flops / t / 1e12, frac_matmul=flops / t / rate,
              ceiling=ceiling,
              roofline_us=max(nbytes / bw, flops / rate) * 1e6,
              vs_bf16=t_bf16 / t, max_err=err, tried=tried)


def run(args):
  """Times the table's rows; writes args.out (JSON) and the markdown
  (args.markdown, default the JSON path with .md). --match filters the
  8-bit rows by 'qmatmul SHAPE M=.. FORMAT IMPL'; bf16 always runs."""
  smoke = args.smoke
  e, f = (128, 256) if smoke else (4096, 12288)
  ms = args.ms or ([20] if smoke else [16, 144, 1024, 4608])
  reps = args.reps or (2 if smoke else 10)
  inner = args.inner or (1 if smoke else 20)
  limit = args.tune_limit if args.tune else (1 if smoke else 4)
  n = 256 if smoke else 8192
  data = dict(jax=jax.__version__, device=jax.devices()[0].device_kind,
              ceilings=dict(
                  copy_gb_s=copy_bandwidth((8 if smoke else 2048) << 20,
                                           reps, inner) / 1e9,
                  bf16_tflop_s=matmul_rate(n, reps=reps) / 1e12,
                  fp8_tflop_s=fp8_matmul_rate(n, reps=reps) / 1e12),
              rows=[])
  print(table(data), flush=True)
  md = Path(args.markdown or Path(args.out).with_suffix(".md"))
  time_it = lambda fn, *a: timeit(stateless(fn), None, *a, reps=reps,
                                  inner=inner)
  for name, (ein, o, epilogue) in shapes(e, f).items():
    for m in ms:
      t_bf16 = None
      for fmt, impl in VARIANTS:
        label = f"qmatmul {name} M={m} {fmt} {impl}"
        if fmt != "bf16" and args.match and not re.search(args.match, label):
          continue
        x, w, kw = _operands(ein, o, epilogue, m, fmt)
        t, out, want, tiling, tried = _time_variant(
            time_it, x, w, kw, fmt, impl,
            _configs(fmt, m, ein, o, limit, impl), smoke)
        if t is None:
          print(f"{label}: no tiling ran: {tried}", flush=True)
          continue
        t_bf16 = t_bf16 or t
        z = 1 if fmt == "bf16" else w[1].shape[1]
        row = _row(data, name, ein, o, epilogue, m, fmt, impl, t, t_bf16,
                   max_err(out, want), tiling, tried, z)
        data["rows"].append(row)
        print({k: v for k, v in row.items() if k != "tried"}, flush=True)
        Path(args.out).write_text(json.dumps(data, indent=1))
        md.write_text(table(data) + "\n")
  print(table(data))
  return data
