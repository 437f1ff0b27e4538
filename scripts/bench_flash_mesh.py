"""LLaDA2.0-flash (100B MoE) decode steps on one host's GPUs, per mesh.

Random weights at the flash's shapes (the `llada2-flash` preset, from
tests/reference/llada2-flash/config.json: 102.9B parameters), built
directly on their mesh shards (bf16: 206 GB; fp8: every projection, the
experts included, in 8 bits). Strategies `llada2` (block cache, the pure
schedule of --per-step tokens a step) and `llada2-flash` (a draft and a
verify pass a step). Per mesh, format, strategy and batch: ms per step
beside the per-GPU floor measured in the same run (the larger of: the
weights one GPU holds read once at the copy rate measured here, the routed
experts a step can touch counted as in bench_moe.py; the step's FLOPs over
all GPUs at the measured bf16 matmul rate), tokens/s per GPU, every
device's peak memory (memory_stats: the process's peak so far), and a
digest of the token ids (the first mesh's compared with each other
mesh's of the run). --profile traces one decode a (mesh, strategy) at the
largest batch: the collective kernels' (all-to-all, all-reduce / psum,
all-gather) share of the device time.

A mesh is 'none' (one device, no mesh) or a --mesh spec; one that needs
more devices than present is skipped, one the shapes cannot split names why
(parallel.check_config: model=8 needs 8 KV heads, the flash has 4).

--layers N keeps the first N layers (the dense one and N-1 MoE layers): a
slice that fits one GPU. --layer-diff also times a 2-layer model and
prints ms per MoE layer ((ms(N) - ms(2)) / (N - 2)) against one MoE
layer's floor.

  python scripts/bench_flash_mesh.py --meshes model=4 --formats bf16 \\
      --json OUT/flash-model4-bf16.json              # 4 or 8 GPUs
  python scripts/bench_flash_mesh.py --meshes none --layers 4 --layer-diff \\
      --strategies llada2 --json OUT/slice.json      # one GPU
  python scripts/bench_flash_mesh.py --smoke --json /tmp/f.json
  (--smoke on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench_moe import step_sampler  # noqa: E402
from flash_dllm_bench import timing, trace_summary  # noqa: E402
from flash_dllm_jax import parallel  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402

MESHES = ("model=4", "data=2,model=4", "model=8")


def local_bytes(params, prefix: str = "") -> int:
  """Bytes of the leaves (under names containing `prefix`) that the first
  device holds."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return sum(x.addressable_shards[0].data.nbytes for path, x in flat
             if prefix in jax.tree_util.keystr(path))


def device_peaks_gb() -> list[float | None]:
  """Every local device's peak bytes in use so far, in GB (None where the
  backend keeps no statistics)."""
  out = []
  for d in jax.local_devices():
    stats = d.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    out.append(None if peak is None else peak / 1e9)
  return out


def collective_share(go, steps: int) -> dict:
  """One traced decode: the collective kernels' ms per step (all devices'
  kernels summed, so per device divide by the device count) and their
  share of the device busy time."""
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      jax.block_until_ready(go())
    kernels, _ = trace_summary.device_kernels(trace_summary.load_events(
        trace_summary.find_trace(tmp)))
  s = trace_summary.summarize(kernels)
  coll = s.by_category.get("collective", (0.0, 0))[0]
  top = [(n, ms / steps) for n, (ms, _) in s.by_kernel.items()
         if trace_summary.category(n) == "collective"][:5]
  return dict(busy_ms_per_step=s.busy_ms / steps,
              collective_ms_per_step=coll / steps,
              collective_share=coll / s.busy_ms if s.busy_ms else None,
              top_collectives=top)


def bench_config(args):
  if args.smoke:  # heads, KV heads, widths and experts split 4 ways
    return ModelConfig.tiny("llada2", dtype="bfloat16", n_heads=8,
                            n_kv_heads=4, head_dim=16)
  cfg = ModelConfig.preset("llada2-flash", dtype="bfloat16")
  return cfg.replace(max_seq_len=max(cfg.max_seq_len,
                                     args.prompt + args.gen + args.block))


def run_mesh(cfg, spec, fmt, args, bw, mm, rows, tokens):
  """Every strategy and batch of one (mesh, format), appended to rows."""
  mesh = None if spec == "none" else parallel.parse_mesh(spec)
  n_dev = 1 if mesh is None else mesh.devices.size
  t0 = time.perf_counter()
  quant = None if fmt == "bf16" else fmt
  params = timing.bench_params(cfg, quantize=quant, mesh=mesh)
  qcfg = cfg.replace(quantize=quant)
  jax.block_until_ready(params)
  dev_bytes, dev_routed = local_bytes(params), local_bytes(params, "experts_")
  print(f"[{spec} {fmt}] weights built in {time.perf_counter() - t0:.1f} s;"
        f" {dev_bytes / 1e9:.2f} GB on each device (routed experts "
        f"{dev_routed / 1e9:.2f})", flush=True)
  layer_bytes = local_bytes(params, "['layers_1']")  # the first MoE layer
  m, data = cfg.moe, parallel.data_size(mesh)
  for name in args.strategies:
    sampler, passes = step_sampler(name, args)
    for b in args.batch:
      row = dict(mesh=spec, format=fmt, strategy=name, batch=b,
                 layers=cfg.n_layers, devices=n_dev,
                 moe_layer_bytes=layer_bytes)
      try:
        if b % data:
          raise ValueError(f"batch {b} does not split over data={data}")
        go = timing.decode_runner(qcfg, params, sampler, b, args.prompt,
                                  mesh)
        t1 = time.perf_counter()
        out = jax.block_until_ready(go())
        first = time.perf_counter() - t1
        seconds = timing.time_fn(go, reps=args.reps, warmup=0)
        steps = int(out[2])
        q, n = args.block, args.prompt + args.gen + args.block - 1
        touched = min(1.0, b // data * q * m.top_k / m.n_experts)
        floor = passes * max(
            (dev_bytes - (1 - touched) * dev_routed) / bw,
            timing.forward_flops(cfg, b, q, n, args.block) / (mm * n_dev))
        ids = np.asarray(out[0])
        digest = hashlib.sha256(ids.tobytes()).hexdigest()[:16]
        tokens.setdefault((fmt, name, b), []).append((spec, digest))
        row.update(steps=steps, ms=seconds / steps * 1e3,
                   floor_ms=floor * 1e3, compile_s=first - seconds,
                   tok_s_gpu=b * args.gen / seconds / n_dev,
                   peak_gb=device_peaks_gb(), tokens_sha=digest)
        if args.profile and b == max(args.batch):
          row.update(collective_share(go, steps))
      except Exception as e:  # noqa: BLE001 (a failed shape still reports)
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows.append(row)
      print({k: v for k, v in row.items() if k != "top_collectives"},
            flush=True)
  del params
  gc.collect()


def layer_diff(args, bw, mm, rows):
  """ms per MoE layer: the --layers rows against a 2-layer model's (the
  dense layer and one MoE layer) of the same mesh, format, strategy and
  batch; its floor one MoE layer's weights on a device read once."""
  cfg = bench_config(args).replace(n_layers=2)
  short = []
  for fmt in args.formats:
    for spec in args.meshes:
      run_mesh(cfg, spec, fmt, args, bw, mm, short, {})
  key = ("mesh", "format", "strategy", "batch")
  for r in short:
    for full in rows:
      if not (all(full[k] == r[k] for k in key) and "ms" in full
              and "ms" in r and full["layers"] > 2):
        continue
      full["moe_layer_ms"] = (full["ms"] - r["ms"]) / (full["layers"] - 2)
      full["moe_layer_floor_ms"] = r["moe_layer_bytes"] / bw * 1e3
      full["rest_ms"] = r["ms"] - full["moe_layer_ms"]
      print(f"{full['mesh']} {full['format']} {full['strategy']} batch "
            f"{full['batch']}: {full['moe_layer_ms']:.3f} ms per MoE layer "
            f"(floor {full['moe_layer_floor_ms']:.3f}, "
            f"{full['moe_layer_floor_ms'] / full['moe_layer_ms']:.0%}); the "
            f"rest (embedding, dense layer, head, sampling) "
            f"{full['rest_ms']:.2f} ms", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--meshes", nargs="+", default=list(MESHES),
                  help="'none' or --mesh specs (default: %(default)s)")
  ap.add_argument("--formats", nargs="+", default=["bf16", "fp8"],
                  choices=["bf16", "fp8"])
  ap.add_argument("--strategies", nargs="+",
                  default=["llada2", "llada2-flash"],
                  choices=["llada2", "llada2.1", "llada2-flash"])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
  ap.add_argument("--gen", type=int, default=256)
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--per-step", type=int, default=16)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--reps", type=int, default=1)
  ap.add_argument("--layers", type=int, default=0,
                  help="keep the first N layers (0: all)")
  ap.add_argument("--layer-diff", action="store_true",
                  help="also a 2-layer model: ms per MoE layer")
  ap.add_argument("--profile", action="store_true",
                  help="trace one decode at the largest batch: the "
                  "collectives' share of device time")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny model, CPU devices (>= 8 for the meshes)")
  ap.add_argument("--json", type=Path, required=True)
  args = ap.parse_args(argv)
  args.window = False  # step_sampler's block cache
  t0 = time.perf_counter()
  if args.smoke:
    args.gen, args.prompt, args.block, args.per_step = 16, 8, 8, 4
    args.batch = [2]
    bw, mm = timing.copy_bandwidth(0.01, 3), timing.matmul_rate(256, 3)
  else:
    bw, mm = timing.copy_bandwidth(), timing.matmul_rate()
  cfg = bench_config(args)
  if args.layers:
    cfg = cfg.replace(n_layers=args.layers)
  if args.layer_diff and cfg.n_layers <= 2:
    ap.error("--layer-diff needs --layers of at least 3")
  n = len(jax.local_devices())
  print(f"{jax.local_devices()[0].device_kind} x {n}; jax {jax.__version__};"
        f" copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s; "
        f"{cfg.n_layers} layers, prompt {args.prompt}, gen {args.gen}, "
        f"{args.per_step} tokens a step", flush=True)
  rows, tokens, skipped = [], {}, []
  for spec in args.meshes:
    try:
      mesh = None if spec == "none" else parallel.parse_mesh(spec)
      parallel.check_config(cfg, mesh)
    except ValueError as e:
      skipped.append(dict(mesh=spec, reason=str(e)))
      print(f"[{spec}] skipped: {e}", flush=True)
      continue
    for fmt in args.formats:
      run_mesh(cfg, spec, fmt, args, bw, mm, rows, tokens)
  if args.layer_diff:
    layer_diff(args, bw, mm, rows)
  same = {}
  for (fmt, name, b), runs in tokens.items():
    for spec, digest in runs[1:]:
      same[f"{fmt} {name} batch {b}: {spec} = {runs[0][0]}"] = (
          digest == runs[0][1])
  print("\n| mesh | format | strategy | batch | ms/step | per-GPU floor ms | "
        "floor / ms | tokens/s/GPU | peak GB (max over devices) | "
        "collectives |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['mesh']} | {r['format']} | {r['strategy']} | "
            f"{r['batch']} | {r['error']} | | | | | |")
      continue
    peaks = [p for p in r["peak_gb"] if p is not None]
    peak = f"{max(peaks):.1f}" if peaks else "–"
    share = r.get("collective_share")
    coll = "–" if share is None else (
        f"{share:.0%} ({r['collective_ms_per_step']:.2f} ms)")
    print(f"| {r['mesh']} | {r['format']} | {r['strategy']} | {r['batch']} "
          f"| {r['ms']:.2f} | {r['floor_ms']:.2f} | "
          f"{r['floor_ms'] / r['ms']:.0%} | {r['tok_s_gpu']:.1f} | {peak} | "
          f"{coll} |")
  for what, equal in same.items():
    print(f"token ids {what}: {'equal' if equal else 'DIFFERENT'}")
  args.json.parent.mkdir(parents=True, exist_ok=True)
  args.json.write_text(json.dumps(dict(
      device=jax.local_devices()[0].device_kind, devices=n,
      jax=jax.__version__, copy_Bps=bw, matmul_flops=mm,
      config=cfg.to_dict(), args={k: str(v) for k, v in vars(args).items()},
      rows=rows, skipped=skipped, tokens_equal=same,
      seconds=time.perf_counter() - t0), indent=1, default=str))
  print(f"wrote {args.json} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
  main()
