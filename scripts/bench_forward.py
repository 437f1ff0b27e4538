"""Full-forward and reference-decode timings at the real model shapes.

Random bf16 weights at the LLaDA-8B (or Dream-7B) geometry; ms per full
forward at batch B x N tokens, compile time and peak device memory, against
the weight-read floor (weight bytes / copy bandwidth measured in this run) and
the matmul ceiling (FLOPs / bf16 matmul rate measured in this run).

  python scripts/bench_forward.py --arch llada --batch 1 32 --seq 1024
  python scripts/bench_forward.py --smoke        # tiny model, any backend
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.model import Transformer  # noqa: E402
from flash_dllm_jax.architectures.dream.sampler import DreamSampler  # noqa: E402,E501
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler  # noqa: E402,E501


def weight_bytes(params) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def bench_forward(cfg, params, b, n, head_rows, reps):
  model = Transformer(cfg)
  tokens = jax.random.randint(jax.random.key(b), (b, n), 0, cfg.vocab_size - 1)
  pos = jnp.broadcast_to(jnp.arange(n), (b, n))
  valid = jnp.ones((b, n), bool)
  rows = jnp.broadcast_to(jnp.arange(n - head_rows, n), (b, head_rows))

  def fwd(p, t):
    return model.apply({"params": p}, t, pos, valid, logit_rows_BxR=rows)[0]

  t0 = time.perf_counter()
  compiled = jax.jit(fwd).lower(params, tokens).compile()
  compile_s = time.perf_counter() - t0
  seconds = timing.time_fn(lambda: compiled(params, tokens), reps=reps)
  return seconds, compile_s


def bench_decode(cfg, params, b, prompt_len, gen, block, reps):
  """ms per step of the reference sampler (one full forward per step)."""
  if cfg.arch == "llada":
    sampler = LLaDASampler(gen_length=gen, steps=gen, block_length=block)
  else:
    sampler = DreamSampler(gen_length=gen, steps=gen, alg="entropy")
  ms_step, compile_s, _, _ = timing.time_decode(cfg, params, sampler, b,
                                                 prompt_len, reps)
  return ms_step, compile_s


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--arch", choices=["llada", "dream"], default="llada")
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--head-rows", type=int, nargs="+", default=None,
                  help="rows whose logits are computed (default: all, and 32)")
  ap.add_argument("--decode", type=int, nargs="*", default=[1],
                  help="batch sizes for the reference-sampler decode timing")
  ap.add_argument("--gen", type=int, default=256)
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--smoke", action="store_true",
                  help="tiny model and shapes: checks the script runs")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)

  if args.smoke:
    cfg = ModelConfig.tiny(args.arch, dtype="bfloat16")
    args.batch, args.seq, args.reps, args.gen = [1, 2], 64, 2, 16
    args.decode = [1]
    bw, mm = timing.copy_bandwidth(0.01, 3), timing.matmul_rate(256, 3)
  else:
    cfg = (ModelConfig.preset("llada-8b") if args.arch == "llada"
           else ModelConfig.preset("dream-7b"))
    bw, mm = timing.copy_bandwidth(), timing.matmul_rate()
  params = timing.bench_params(cfg)
  wbytes = weight_bytes(params)
  device = jax.devices()[0].device_kind
  print(f"device: {device}; jax {jax.__version__}; {cfg.arch} "
        f"{cfg.num_params() / 1e9:.2f}B params, {wbytes / 1e9:.2f} GB")
  print(f"ceilings measured now: copy {bw / 1e12:.2f} TB/s, bf16 matmul "
        f"{mm / 1e12:.0f} TFLOP/s")
  head_rows = args.head_rows or [args.seq, 32]
  rows = []
  for b in args.batch:
    for hr in head_rows:
      seconds, compile_s = bench_forward(cfg, params, b, args.seq, hr, args.reps)
      flops = timing.forward_flops(cfg, b, args.seq, args.seq, hr)
      floor_w, floor_c = wbytes / bw, flops / mm
      rows.append(dict(kind="forward", batch=b, tokens=args.seq, head_rows=hr,
                       ms=seconds * 1e3, compile_s=compile_s,
                       tflops=flops / seconds / 1e12,
                       weight_floor_ms=floor_w * 1e3,
                       matmul_floor_ms=floor_c * 1e3,
                       vs_roofline=max(floor_w, floor_c) / seconds,
                       peak_gb=(timing.peak_memory_bytes() or 0) / 1e9))
  for b in args.decode:
    prompt = args.seq - args.gen
    ms_step, compile_s = bench_decode(cfg, params, b, prompt, args.gen,
                                      min(32, args.gen),
                                      max(1, args.reps // 5))
    rows.append(dict(kind="decode", batch=b, tokens=args.seq, head_rows=32,
                     ms=ms_step * 1e3, compile_s=compile_s,
                     peak_gb=(timing.peak_memory_bytes() or 0) / 1e9))

  print("\n| kind | batch x tokens | logit rows | ms | compile s | TFLOP/s "
        "| weight-read floor ms | matmul floor ms | roofline / measured "
        "| peak GB |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    extra = ("| {tflops:.0f} | {weight_floor_ms:.2f} | {matmul_floor_ms:.2f} "
             "| {vs_roofline:.0%} ".format(**r) if r["kind"] == "forward"
             else "| | | | ")
    print(f"| {r['kind']}{' (ms/step)' if r['kind'] == 'decode' else ''} "
          f"| {r['batch']} x {r['tokens']} | {r['head_rows']} | {r['ms']:.2f} "
          f"| {r['compile_s']:.1f} {extra}| {r['peak_gb']:.1f} |")
  if args.json:
    args.json.write_text(json.dumps(dict(device=device, jax=jax.__version__,
                                         copy_Bps=bw, matmul_flops=mm,
                                         rows=rows), indent=1))


if __name__ == "__main__":
  main()
