"""Block-causal attention of one layer at LLaDA2.0-mini's shapes (16 heads
over 4 KV heads of 128), the kernel's block-by-block path
(ops.blockwise_attention, Kernels(block_attention="split"), the default on a GPU) beside the fused path (JAX's fused
attention, cuDNN on a GPU, over every slot with the block-causal mask;
the plain-JAX reference elsewhere), both timed in this run:

  block   a block-cache step's attention: one block of --block queries (the
          first answer block) over a cache of prompt + gen slots; its
          floor is the keys up to the block's end (K and V, bf16) read once
          at the copy rate measured here, and its achieved bytes/s is that
          read over the time;
  window  the uncached (whole-window) forward's attention over every slot;
          its floor the larger of the K/V read once and the causal
          triangle's FLOPs (2 x 2 x keys seen x head dim per query head) at
          the bf16 matmul rate measured here.

Also checks, on the same inputs, that the kernel's block rows are the bits
of its window rows (the block cache's exactness claim). Prints a table,
writes JSON under --out.

  python scripts/bench_block_attention.py --prompt 4096 32768 --batch 1 8
  python scripts/bench_block_attention.py --smoke   # tiny, any backend
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax import ops  # noqa: E402
from flash_dllm_jax.eval.records import peak_memory_bytes  # noqa: E402
from pallas_kernels.common import on_gpu  # noqa: E402


def inputs(b, n, h, kh, d, block):
  """q, k, v [B, N, ., D] bf16 and the whole-window BlockCausal (blocks of
  `block` from slot 0, every slot valid)."""
  ks = jax.random.split(jax.random.key(0), 3)
  f = lambda k, m: jax.random.normal(k, (b, n, m, d), jnp.bfloat16)
  pos = jnp.broadcast_to(jnp.arange(n), (b, n))
  mask = ops.BlockCausal(jnp.ones((b, n), bool), pos // block, pos // block,
                         pos % block, block)
  return f(ks[0], h), f(ks[1], kh), f(ks[2], kh), mask


def block_mask(mask, start, block):
  """The BlockCausal of queries [start, start + block) over the whole cache."""
  b = mask.key_valid_BxS.shape[0]
  pos = jnp.broadcast_to(start + jnp.arange(block), (b, block))
  return dataclasses.replace(mask, blocks_BxQ=pos // block,
                             rows_BxQ=pos % block)


def run_case(b, prompt, args, impls, bw, mm):
  """Rows of one (batch, prompt): block and window, kernel and fused."""
  h, kh, d, bl = args.heads, args.kv_heads, args.head_dim, args.block
  n = prompt + args.gen
  q, k, v, mask = inputs(b, n, h, kh, d, bl)
  start = prompt - prompt % bl  # the first answer block's first slot
  blk = block_mask(mask, start, bl)
  q_blk = q[:, start:start + bl]
  scale = d ** -0.5
  kv_bytes = lambda keys: 2 * keys * kh * d * 2 * b  # K and V, bf16
  tri_keys = sum(min(n, (j + 1) * bl) * min(bl, n - j * bl)
                 for j in range(-(-n // bl)))
  cases = {
      "block": (q_blk, blk, kv_bytes(start + bl),
                4 * bl * (start + bl) * h * d * b),
      "window": (q, mask, kv_bytes(n), 4 * tri_keys * h * d * b)}
  rows, outs = [], {}
  for what, (qq, m, nbytes, flops) in cases.items():
    base = None
    for path, impl in impls:
      mm_ = m if path == "kernel" else dataclasses.replace(m,
                                                           block_length=None)
      fn = jax.jit(lambda q_, k_, v_, m_, impl=impl: ops.attention(
          q_, k_, v_, m_, scale=scale, implementation=impl))
      try:
        out = jax.block_until_ready(fn(qq, k, v, mm_))
        ms = timing.time_fn(lambda: fn(qq, k, v, mm_), reps=args.reps) * 1e3
      except Exception as e:  # noqa: BLE001 (a failed shape still reports)
        rows.append(dict(what=what, path=path, batch=b, prompt=prompt,
                         error=f"{type(e).__name__}: {str(e)[:300]}"))
        print(rows[-1], flush=True)
        continue
      outs[what, path] = out
      floor_ms = max(nbytes / bw, flops / mm) * 1e3
      base = base or ms
      rows.append(dict(what=what, path=path, batch=b, prompt=prompt,
                       slots=n, ms=ms, floor_ms=floor_ms,
                       read_gbps=nbytes / ms / 1e6,
                       of_copy_rate=nbytes / (ms / 1e3) / bw,
                       tflops=flops / ms / 1e9,
                       fused_over_this=base / ms,
                       peak_gb=(peak_memory_bytes() or 0) / 1e9))
      print(rows[-1], flush=True)
  if ("block", "kernel") in outs and ("window", "kernel") in outs:
    same = np.array_equal(
        np.asarray(outs["block", "kernel"]),
        np.asarray(outs["window", "kernel"][:, start:start + bl]))
    for r in rows:
      if r["path"] == "kernel":
        r["block_rows_are_window_bits"] = bool(same)
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompt", type=int, nargs="+", default=[4096, 32768])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--gen", type=int, default=512)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--kv-heads", type=int, default=4)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--layers", type=int, default=20,
                  help="layers a step runs (the per-step column)")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--out", type=Path, default=None,
                  help="directory for block_attention.json")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny shapes (any backend; the kernel interpreted "
                  "off a GPU)")
  args = ap.parse_args(argv)
  if args.smoke:
    args.prompt, args.batch, args.gen, args.block = [40], [1, 2], 8, 4
    args.heads, args.kv_heads, args.head_dim, args.reps = 4, 2, 16, 1
    bw, mm = timing.copy_bandwidth(0.01, 3), timing.matmul_rate(256, 3)
  else:
    bw, mm = timing.copy_bandwidth(), timing.matmul_rate()
  # The split path (Kernels.block_attention "split"); on a GPU the Triton
  # kernel with the automatic split, elsewhere interpreted (at --smoke in
  # splits of one 16-key tile).
  kernel = ops.Kernels(block_attention="split")
  if not on_gpu():
    kernel = dataclasses.replace(kernel, name="pallas_interpret")
    if args.smoke:
      kernel = dataclasses.replace(kernel, attention=ops.Tiling(
          block_k=16, split_tiles=1))
  impls = [("fused", ops.Kernels(block_attention="fused") if on_gpu()
            else "reference"), ("kernel", kernel)]
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s",
        flush=True)
  rows = [r for p in args.prompt for b in args.batch
          for r in run_case(b, p, args, impls, bw, mm)]
  if args.out:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "block_attention.json").write_text(json.dumps(dict(
        copy_Bps=bw, matmul_flops=mm, args={k: str(v) for k, v in
                                            vars(args).items()},
        rows=rows), indent=1))
  print(f"\n| attention | path | batch | prompt | ms | x {args.layers} "
        "layers | floor ms | floor / ms | read GB/s | of copy rate | "
        "fused ms / ms | peak GB | block = window bits |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['what']} | {r['path']} | {r['batch']} | {r['prompt']} | "
            f"{r['error']} | | | | | | | | |")
      continue
    print(f"| {r['what']} | {r['path']} | {r['batch']} | {r['prompt']} | "
          f"{r['ms']:.3f} | {r['ms'] * args.layers:.2f} | "
          f"{r['floor_ms']:.3f} | {r['floor_ms'] / r['ms']:.0%} | "
          f"{r['read_gbps']:.0f} | {r['of_copy_rate']:.0%} | "
          f"{r['fused_over_this']:.2f} | {r['peak_gb']:.2f} | "
          f"{r.get('block_rows_are_window_bits', '–')} |")


if __name__ == "__main__":
  main()
