"""LLaDA2 (block-diffusion MoE) decode steps at the LLaDA2.0-mini shapes.

Random bf16 weights at the mini's geometry (16.3B parameters, 256 experts,
8 per token); strategy `llada2` on the pure schedule (`--per-step` tokens a
step, so random weights do not change the step count), every position
decoded; with `--strategies llada2-flash` also its draft + verify step
(its floor two passes); with `llada2.1` LLaDA2.1's step (M2T on the same
schedule, T2T editing of every committed token of the block whose argmax
changed, at most 2 post-edit steps a block), its ratio to llada2's step of
the same batch printed after the table. Prints ms per step against its floor, the larger of two
measured in this run: every weight read once per step (a step of hundreds
of tokens routes to every expert) at the copy rate, and the step's FLOPs
(K experts a token) at the measured bf16 matmul rate. Plus one MoE layer
alone (router, routed experts, shared expert) at the step's token counts,
its routed experts by the grouped kernel at each --tilings (the GPU's
default path, Triton; Pallas interpret mode elsewhere), by Mosaic GPU's
grouped kernel (`--layer-paths mosaic`, row tiles of its own choosing; its
interpret mode elsewhere; the first Triton tiling's ms over its ms, same
batch and tokens, printed after the table) and by the dense every-expert
path (implementation 'reference'), against the same floor; at the whole
window's tokens, and with `--layer-tokens block` at a block-cache step's
(batch * block; its floor reads min(1, tokens * K / X) of the routed
experts, which random routing may leave some of unread: a floor to read
with care at batch 1). `--gemm FMT..` times the routed experts' grouped
GEMMs alone (flash_dllm_bench/grouped_bench.py: the experts their routing
touches, counted exactly).

  python scripts/bench_moe.py --batch 1 32 --gen 512 --prompt 768
  python scripts/bench_moe.py --batch 1 32 --window  # no block cache
  python scripts/bench_moe.py --smoke          # tiny model, any backend
  python scripts/bench_moe.py --layer-paths --batch 1 --prompt 32768 \
      --gen 512 --reps 1 --steady     # the step without the prefill
  python scripts/bench_moe.py --layer-only --layer-paths grouped mosaic \
      --layer-tokens window block             # Triton beside Mosaic GPU
  python scripts/bench_moe.py --layer-only --layer-paths --gemm bf16 int8
      # the grouped GEMMs alone, Triton beside Mosaic GPU
  python scripts/bench_moe.py --layer-paths --batch 1 8 --prompt 4096 \
      --block-attention fused split   # block-causal attention's two paths

--block-attention fused split times each decode with JAX's fused
block-causal attention and with the scheduled kernel block by block
(Kernels.block_attention, whose default is split on a GPU; interpreted off a
GPU), the split step's ms over
the fused step's of the same strategy and batch printed after the table.

--steady (llada2, llada2.1) also times a second schedule of twice the
tokens a step (half the steps, the same prefill): the steady step is the
time difference over the step difference, and the prefill's share the
rest of the first decode (ms x steps - steady x steps).

With --window the step's floor counts the whole window's queries and every
expert; a block-cache step's floor counts one block's queries and at most
batch * block * top_k of each layer's routed experts (a pair step runs two
blocks, so the floor is a lower bound).
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

from flash_dllm_bench import grouped_bench, timing, tuning  # noqa: E402
from flash_dllm_jax import ops, quantize  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.model import moe  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402
from pallas_kernels.common import on_gpu  # noqa: E402

# The MoE layer's routed experts: (name, implementation); grouped is the
# Triton kernel and mosaic Mosaic GPU's (compiled on a GPU, interpreted
# elsewhere), dense every expert on every row.
KERNEL = None if on_gpu() else "pallas_interpret"
LAYER_PATHS = (("grouped", KERNEL),
               ("mosaic", ops.Kernels(KERNEL, experts_backend="mosaic")),
               ("dense", "reference"))


def moe_layer_ms(cfg, params, tokens: int, reps: int,
                 implementation=None) -> float:
  """Median ms of one MoE layer (its own params) on `tokens` random rows."""
  layer = moe.MoE(cfg, jnp.bfloat16, implementation)
  x = jax.random.normal(jax.random.key(5), (1, tokens, cfg.d_model),
                        jnp.bfloat16)
  run = jax.jit(lambda p, x: layer.apply({"params": p}, x, x))
  jax.block_until_ready(run(params, x))
  return timing.time_fn(lambda: run(params, x), reps=reps) * 1e3


def parse_tiling(text: str) -> ops.ExpertTiling:
  """'64,128,64' or '64,128,64,4,3' -> ExpertTiling (argparse type)."""
  names = ("tile_m", "block_n", "block_k", "num_warps", "num_stages")
  try:
    values = [int(v) for v in text.split(",")]
    if not 3 <= len(values) <= 5:
      raise ValueError("3 to 5 integers")
    return ops.ExpertTiling(**dict(zip(names, values)))
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"tiling {text!r}: {e}") from None


def tiling_name(t: ops.ExpertTiling) -> str:
  return (f"m{t.tile_m} n{t.block_n} k{t.block_k} w{t.num_warps} "
          f"s{t.num_stages}")


def step_sampler(name: str, args):
  """(sampler, model passes a step) of a timed strategy: llada2 on the pure
  schedule (--per-step tokens a step); llada2.1 on the same schedule with
  editing_threshold 0 (every changed argmax edits) and 2 post-edit steps;
  llada2-flash with its defaults, a draft and a verify pass a step (random
  weights commit about one token a step, so its tokens per step come from
  a trained model)."""
  if name == "llada2":
    return build_sampler("llada2", "llada2", dict(
        gen_length=args.gen, block_length=args.block, threshold=None,
        steps=args.block // args.per_step,
        block_cache=not args.window)), 1
  if name == "llada2.1":
    return build_sampler("llada2.1", "llada2", dict(
        gen_length=args.gen, block_length=args.block, threshold=None,
        num_to_transfer=args.per_step, editing_threshold=0.0,
        max_post_steps=2, block_cache=not args.window)), 1
  return build_sampler(name, "llada2", dict(
      gen_length=args.gen, block_length=args.block,
      block_cache=not args.window)), 2


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--gen", type=int, default=512)
  ap.add_argument("--prompt", type=int, default=768)
  ap.add_argument("--per-step", type=int, default=16)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--window", action="store_true",
                  help="re-run the whole window each step (block_cache "
                       "off, the reference's way) instead of the block cache")
  ap.add_argument("--strategies", nargs="+", default=["llada2"],
                  choices=["llada2", "llada2.1", "llada2-flash"],
                  help="decodes to time (llada2-flash: one timed run)")
  ap.add_argument("--steady", action="store_true",
                  help="llada2 / llada2.1: also the steady step (a second "
                  "schedule of twice the tokens a step) and the prefill's "
                  "share of the decode")
  ap.add_argument("--json", type=Path, default=None)
  ap.add_argument("--preset", default="llada2-mini",
                  choices=["llada2-mini", "llada2.1-mini", "llada2-flash"],
                  help="the shapes (default: %(default)s)")
  ap.add_argument("--mesh", default=None,
                  help="decode on this mesh ('model=4'), the random weights "
                  "built on their shards; the MoE layer alone is not timed "
                  "and the floors stay the whole model's (per GPU: "
                  "bench_flash_mesh.py)")
  ap.add_argument("--layer-only", action="store_true",
                  help="only the MoE layer, no decode")
  ap.add_argument("--layer-paths", nargs="*", default=["grouped", "dense"],
                  choices=[n for n, _ in LAYER_PATHS],
                  help="the MoE layer's routed-expert paths to time (none: "
                  "the decode steps only)")
  ap.add_argument("--experts-backend", choices=ops.choice.GPU_BACKENDS,
                  default="triton", help="the decode steps' grouped expert "
                  "kernel (default: %(default)s)")
  tuning.add_block_attention_flag(ap, several=True)  # the decode steps'
  ap.add_argument("--gemm", nargs="*", default=[],
                  choices=list(grouped_bench.FORMATS),
                  help="also the routed experts' grouped GEMMs alone in these "
                  "stack formats, Triton beside Mosaic GPU "
                  "(flash_dllm_bench/grouped_bench.py), at the layer's "
                  "token counts")
  ap.add_argument("--layer-tokens", nargs="+", default=["window"],
                  choices=["window", "block"],
                  help="the MoE layer's token counts: the whole window's "
                  "(batch * (prompt + gen + block - 1)) and/or a block-cache "
                  "step's (batch * block)")
  ap.add_argument("--tilings", nargs="+", type=parse_tiling,
                  default=[ops.ExpertTiling()], metavar="M,N,K[,W,S]",
                  help="grouped-kernel tilings the layer is timed with "
                  "(tile_m,block_n,block_k[,num_warps,num_stages]); the "
                  "step runs the first")
  args = ap.parse_args(argv)
  if args.smoke:
    cfg = ModelConfig.tiny("llada2", dtype="bfloat16")
    # expert width 64: Mosaic GPU's kernel takes multiples of 64
    cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, hidden=64))
    args.batch, args.gen, args.prompt, args.reps = [2], 16, 8, 1
    args.block, args.per_step = 8, 4
    bw, mm = timing.copy_bandwidth(0.01, 3), timing.matmul_rate(256, 3)
  else:
    cfg = ModelConfig.preset(args.preset)
    # long prompts past the preset's context: random weights, any RoPE length
    cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len,
                                      args.prompt + args.gen + args.block))
    bw, mm = timing.copy_bandwidth(), timing.matmul_rate()
  if args.mesh:
    args.layer_paths, args.gemm = [], []
  params = timing.bench_params(cfg, mesh=args.mesh)
  wbytes = quantize.weight_bytes(params)
  expert_bytes = wbytes - quantize.weight_bytes(
      {k: v for k, v in params.items() if not k.startswith("layers_")})
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s; "
        f"weights {wbytes / 1e9:.2f} GB", flush=True)
  rows = []
  moe_params = params[f"layers_{cfg.moe.first_dense_layers}"]["moe"]
  layer_bytes = quantize.weight_bytes(moe_params)
  m = cfg.moe
  routed_bytes = (cfg.n_layers - m.first_dense_layers) * quantize.weight_bytes(
      {k: v for k, v in moe_params.items() if k.startswith("experts_")})
  expert_stacks = quantize.weight_bytes(
      {k: v for k, v in moe_params.items() if k.startswith("experts_")})
  for b, which in [(b, q) for b in args.batch for q in args.layer_tokens]:
    tokens = b * (args.block if which == "block" else
                  args.prompt + args.gen + args.block - 1)
    flops = 2 * tokens * cfg.d_model * (
        m.n_experts + 3 * m.hidden * (m.top_k + m.n_shared))
    # the routed experts it can touch: all of them from X / K tokens on
    touched = min(1.0, tokens * m.top_k / m.n_experts)
    read = layer_bytes - (1 - touched) * expert_stacks
    floor_ms = max(read / bw, flops / mm) * 1e3
    runs = [(f"grouped {tiling_name(t)}", ops.Kernels(impl, experts=t))
            for path, impl in LAYER_PATHS if path == "grouped"
            for t in args.tilings]
    runs += [(path, impl) for path, impl in LAYER_PATHS if path != "grouped"]
    for fmt in args.gemm:  # --smoke: without the overlap (interpreted)
      rows += [dict(r, batch=b) for r in grouped_bench.rows(
          m, cfg.d_model, tokens, fmt, bw, mm, args.reps + 1,
          args.tilings[0], interpret=not on_gpu(),
          variants=grouped_bench.VARIANTS[:2 if args.smoke else None])]
    for name, impl in runs:
      if name.split()[0] not in args.layer_paths:
        continue
      kind = f"moe layer {name}"
      try:
        ms = moe_layer_ms(cfg, moe_params, tokens, args.reps + 1, impl)
        rows.append(dict(kind=kind, batch=b, tokens=tokens, ms=ms,
                         floor_ms=floor_ms, gbps=read / ms / 1e6,
                         tflops=flops / ms / 1e9,
                         peak_gb=(timing.peak_memory_bytes() or 0) / 1e9))
      except Exception as e:  # noqa: BLE001 (a failed shape still reports)
        rows.append(dict(kind=kind, batch=b, tokens=tokens,
                         error=f"{type(e).__name__}: {str(e)[:300]}"))
      print(rows[-1], flush=True)
  triton_ms = {}  # (batch, tokens) -> the first Triton tiling's ms
  for r in rows:
    if r["kind"].startswith("moe layer grouped") and "ms" in r:
      triton_ms.setdefault((r["batch"], r["tokens"]), r["ms"])
  for r in rows:
    base_ms = triton_ms.get((r["batch"], r["tokens"]))
    if r["kind"] == "moe layer mosaic" and "ms" in r and base_ms:
      r["triton_over_mosaic"] = base_ms / r["ms"]
  decodes = [(name, b, how) for name in args.strategies for b in args.batch
             for how in args.block_attention]
  for name, b, how in [] if args.layer_only else decodes:
    sampler, passes = step_sampler(name, args)
    kind = f"{name} step" + ("" if how == "default" else f" {how}")
    try:  # off a GPU, split runs interpreted (else the reference's path)
      kernels = ops.Kernels(KERNEL if how == "split" else None,
                            experts=args.tilings[0],
                            experts_backend=args.experts_backend,
                            block_attention=tuning.block_attention(how))
      s_step, compile_s, steps, forwards = timing.time_decode(
          cfg, params, sampler, b, args.prompt,
          args.reps if name != "llada2-flash" else 1,
          implementation=kernels, mesh=args.mesh)
      steady = {}
      if args.steady and name != "llada2-flash":
        twice = argparse.Namespace(**{**vars(args),
                                      "per_step": 2 * args.per_step})
        s2, _, steps2, _ = timing.time_decode(
            cfg, params, step_sampler(name, twice)[0], b, args.prompt,
            args.reps, implementation=kernels, mesh=args.mesh)
        st = (s_step * steps - s2 * steps2) / (steps - steps2)
        steady = dict(steady_ms=st * 1e3,
                      prefill_ms=(s_step - st) * steps * 1e3)
      n = args.prompt + args.gen + args.block - 1
      # A cached step runs at least one block's queries, which touch at
      # most b * block * top_k of each layer's experts.
      q = n if args.window else args.block
      touched = min(1.0, b * q * m.top_k / m.n_experts)
      floor = passes * max((wbytes - (1 - touched) * routed_bytes) / bw,
                           timing.forward_flops(cfg, b, q, n, args.block) / mm)
      rows.append(dict(kind=kind, batch=b, steps=steps,
                       forwards=forwards, ms=s_step * 1e3,
                       floor_ms=floor * 1e3, compile_s=compile_s,
                       tok_s=b * args.gen / (s_step * steps),
                       peak_gb=(timing.peak_memory_bytes() or 0) / 1e9,
                       **steady))
    except Exception as e:  # noqa: BLE001
      rows.append(dict(kind=kind, batch=b,
                       error=f"{type(e).__name__}: {str(e)[:300]}"))
    print(rows[-1], flush=True)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(copy_Bps=bw, matmul_flops=mm,
                                         weight_bytes=wbytes,
                                         expert_bytes=expert_bytes,
                                         rows=rows), indent=1))
  print("\n| what | batch | prompt | ms | floor ms | floor / measured | "
        "tokens/s | peak GB |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['kind']} | {r['batch']} | {args.prompt} | {r['error']} "
            "| | | | |")
      continue
    tok_s = f"{r['tok_s']:.0f}" if "tok_s" in r else "–"
    peak = f"{r['peak_gb']:.2f}" if "peak_gb" in r else "–"
    what = r["kind"] + (f" ({r['tokens']} tokens)" if "tokens" in r else "")
    print(f"| {what} | {r['batch']} | {args.prompt} | {r['ms']:.2f} | "
          f"{r['floor_ms']:.2f} | {r['floor_ms'] / r['ms']:.0%} | {tok_s} | "
          f"{peak} |")
  for r in rows:
    if "triton_over_this" in r:
      print(f"{r['kind']}: Triton ms / its ms, batch {r['batch']}, "
            f"{r['tokens']} tokens, tile_m {r['tile_m']}: "
            f"{r['triton_over_this']:.3f} (floor / its ms "
            f"{r['floor_ms'] / r['ms']:.0%})")
    if "triton_over_mosaic" in r:
      print(f"moe layer Triton ({tiling_name(args.tilings[0])}) ms / Mosaic "
            f"GPU ms, batch {r['batch']}, {r['tokens']} tokens: "
            f"{r['triton_over_mosaic']:.3f} (floor / Mosaic "
            f"{r['floor_ms'] / r['ms']:.0%})")
  for r in rows:
    if "steady_ms" in r:
      print(f"{r['kind']}, batch {r['batch']}, prompt {args.prompt}: "
            f"steady {r['steady_ms']:.2f} ms/step (floor / steady "
            f"{r['floor_ms'] / r['steady_ms']:.0%}), prefill's share "
            f"{r['prefill_ms']:.1f} ms over {r['steps']} steps "
            f"({r['prefill_ms'] / r['steps']:.2f} ms/step)")
  base = {r["batch"]: r["ms"] for r in rows
          if r["kind"] == "llada2 step" and "ms" in r}
  for r in rows:
    if r["kind"] == "llada2.1 step" and "ms" in r and r["batch"] in base:
      print(f"llada2.1 / llada2 ms per step, batch {r['batch']}: "
            f"{r['ms'] / base[r['batch']]:.3f} ({r['steps']} steps, "
            f"{r['forwards']} forwards a row at most; peak "
            f"{r['peak_gb']:.2f} GB)")
  fused = {(r["kind"], r["batch"]): r["ms"] for r in rows
           if r["kind"].endswith(" step fused") and "ms" in r}
  for r in rows:
    base_ms = fused.get((r["kind"].replace(" split", " fused"), r["batch"]))
    if r["kind"].endswith(" step split") and "ms" in r and base_ms:
      print(f"{r['kind']} / fused ms per step, batch {r['batch']}, prompt "
            f"{args.prompt}: {r['ms'] / base_ms:.3f} (floor / split "
            f"{r['floor_ms'] / r['ms']:.0%}; peak {r['peak_gb']:.2f} GB)")


if __name__ == "__main__":
  main()
