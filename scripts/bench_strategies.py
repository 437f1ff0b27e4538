"""Per-strategy decode step time at the real model shapes, fixed commit rule.

Random bf16 weights at the LLaDA-8B geometry; every strategy commits a fixed
number of tokens per step (`--per-step`), so random weights do not distort
the step count. Prints ms per step (draft + verify where there is one), peak
device memory and compile time against the roofline: weight bytes / copy
bandwidth at batch 1, FLOPs / matmul rate (bf16's, fp8's for W8A8 weights)
at large batch, both ceilings measured in this run. ms/step divides the
whole decode by its steps, so it carries a share of the first step's
prefill; --steady also gives the step without it (a second schedule with
twice the tokens per step, or half where twice passes `--block-m`: time
difference over step difference).
Each row also gives tokens/s, whether the main pass's floor is the weight
read or the FLOPs ("bound"), and the KV cache's bytes; a row whose cache
and weights cannot fit the allocator reports so without compiling. With
several --prompt lengths, the attention's cache read rate between them
(extra cache bytes a step reads over the extra step time).

  python scripts/bench_strategies.py --batch 1 32 --gen 256 512 --prompt 768
  python scripts/bench_strategies.py --batch 8 --prompt 1024 2048 --steady
  python scripts/bench_strategies.py --smoke          # tiny model, any backend
  python scripts/bench_strategies.py --model sdar-8b --batch 1 32 --gen 512

--model picks the published shapes (a preset) and so the family: its
strategies run (LLaDA-8B: the list below; SDAR: `sdar` with the static
rule over its block cache, and `sdar-uncached`, the reference's whole-window
forward each step, at batches up to --baseline-max-batch: the baseline the
cached rows are compared with; Fast-dLLM-v2-7B: `fast-dllm-v2`, sub-blocks
of --small-block, one token a step (threshold 1 over tied confidences:
flash_dllm_bench/v2_schedule.py), whole-block forwards, and
`fast-dllm-v2-subblock`, the same steps with the sub-block cache, compared
with the former; their floor counts the whole-block and sub-block forwards
the schedule runs, and --steady takes the second schedule at half the gen).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from flash_dllm_bench import qmatmul_bench, timing, tuning  # noqa: E402
from flash_dllm_bench import v2_schedule  # noqa: E402
from flash_dllm_jax import quantize  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.model import cache as model_cache  # noqa: E402
from flash_dllm_jax.sampling.loop import tail_length  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402


def cache_bytes(cfg, b: int, n: int, kv_cache_dtype: str = "auto") -> int:
  """A full-sequence KV cache's bytes: every layer's keys and values of b
  rows of n positions (and an 8-bit cache's scales)."""
  return b * model_cache.cache_bytes(cfg, n, kv_cache_dtype)


def memory_limit() -> int | None:
  """The allocator's limit on the first device (None: no memory stats)."""
  return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")


def strategies(gen: int, k: int, block: int, block_m: int, layers: int = 32,
               arch: str = "llada", kv_cache_dtype: str = "auto",
               small_block: int = 8):
  """name -> a function building (sampler, passes): passes(prompt, steps,
  forwards) -> [(query tokens, forwards a step)] of the decode's passes, and
  the answer tokens a step. kv_cache_dtype other than "auto" goes to the
  sampler (the Flash-Cache samplers take it; the others refuse it by name).
  A fixed-rule row's main pass runs each step, its second (verify) pass, or
  the main one again, forwards - steps times; Fast-dLLM v2's rows run the
  whole-block and sub-block forwards of v2_schedule.forward_kinds (the
  decode's steps must match it).

  Elastic-Cache's count is its query budget (tracked + new + window); the
  layers after a drift restart run the whole sequence, as often as the
  (random) weights make the drift test fire, so its floor is a lower bound."""
  steps = gen // k
  fixed = {  # (registry name, fixed-rule options, query tokens)
      "llada": (dict(steps=steps, block_length=block), [lambda p: p + gen]),
      "fast-dllm-prefix": (dict(block_length=block, rule="fixed",
                                steps=steps), [lambda p: gen + 1]),
      "fast-dllm-dual": (dict(block_length=block, rule="fixed", steps=steps),
                         [lambda p: block + 1]),
      "flash-cache": (dict(block_m=block_m, rule="fixed", steps=steps),
                      [lambda p: 8 * block_m]),
      "flash-dllm": (dict(block_m=block_m, rule="fixed", steps=steps),
                     [lambda p: 8 * block_m, lambda p: 2 * block_m]),
      # the verify rows (a draft and a mask row per candidate) ride along
      "flash-dllm-onepass": (dict(block_m=block_m, rule="fixed",
                                  steps=steps), [lambda p: 9 * block_m]),
      "elastic-cache": (dict(window=block_m, rule="fixed", steps=steps),
                        [lambda p: layers + 2 * block_m]),
  }
  if arch == "sdar":  # a block's steps commit k masks each (static rule)
    sdar = dict(block_length=block, denoising_steps=max(1, block // k),
                remasking_strategy="low_confidence_static", temperature=0.0)
    fixed = {"sdar": (sdar, [lambda p: block]),
             "sdar-uncached": ({**sdar, "block_cache": False},
                               [lambda p: p + gen + block - 1])}
  kv = {} if kv_cache_dtype == "auto" else {"kv_cache_dtype": kv_cache_dtype}

  def build(name, options, queries):
    sampler = build_sampler(
        name.removesuffix("-uncached").removesuffix("-subblock"), arch,
        {"gen_length": gen, **options, **kv})

    def passes(p, steps, forwards):
      extra = (forwards - steps) / steps
      return [(queries[0](p), 1.0), (queries[-1](p), extra)], k
    return sampler, passes

  if arch == "fast_dllm_v2":
    return {name: functools.partial(v2_schedule.row, gen, block, small_block,
                                    cached, kv)
            for name, cached in (("fast-dllm-v2", False),
                                 ("fast-dllm-v2-subblock", True))}
  # built on demand: a fixed schedule may not suit every sampler
  return {name: functools.partial(build, name, *spec)
          for name, spec in fixed.items()}


def read_rates(rows: list[dict], copy_Bps: float) -> list[str]:
  """The attention's cache read rate between consecutive prompt lengths of
  one strategy, batch and kernels: the extra KV cache bytes a step reads
  (each pass reads the whole cache: forwards / steps passes) over the
  extra step time (steady where measured), against the copy rate."""
  out, groups = [], {}
  for r in rows:
    groups.setdefault((r["strategy"], r["kernels"], r["batch"], r["gen"]),
                      []).append(r)
  for (name, label, b, gen), group in groups.items():
    group.sort(key=lambda r: r["prompt"])
    for lo, hi in zip(group, group[1:]):
      ms = lambda r: r["steady_ms_step"] or r["ms_step"]
      passes = hi["forwards"] / hi["steps"]
      extra = passes * (hi["cache_gb"] - lo["cache_gb"]) * 1e9
      dt = (ms(hi) - ms(lo)) / 1e3
      head = (f"read rate {name} {label or 'default'} batch {b}: prompt "
              f"{lo['prompt']} -> {hi['prompt']}: {ms(hi) - ms(lo):+.2f} ms "
              f"a step for +{extra / 1e9:.2f} GB of cache read")
      if dt <= 0:  # within the timing noise: no rate
        out.append(f"{head}: no extra time measured")
        continue
      rate = extra / dt
      out.append(f"{head}: {rate / 1e12:.2f} TB/s, {rate / copy_Bps:.0%} of "
                 "the copy rate")
  return out


def baseline_ratios(rows: list[dict]) -> list[str]:
  """Each row's ms/step against its baseline row of the same batch, prompt,
  gen and kernels measured in this run: `X-uncached` for X, and X for
  `X-subblock` (Fast-dLLM v2's sub-block cache against whole-block steps)."""
  key = lambda r, name: (name, r["kernels"], r["batch"], r["prompt"],
                         r["gen"])
  base = {key(r, r["strategy"]): r for r in rows}
  out = []
  for r in rows:
    name = r["strategy"]
    b = base.get(key(r, name + "-uncached"))
    if b is None and name.endswith("-subblock"):
      b = base.get(key(r, name.removesuffix("-subblock")))
    if b is not None:
      out.append(f"{r['strategy']} batch {r['batch']} (prompt {r['prompt']}, "
                 f"gen {r['gen']}): {r['ms_step']:.2f} ms/step (weight-read "
                 f"floor {r['read_floor_ms']:.2f}, roofline "
                 f"{r['floor_ms']:.2f}, peak {r['peak_gb'] or 0:.2f} GB) vs "
                 f"{b['ms_step']:.2f} {b['strategy']} (roofline "
                 f"{b['floor_ms']:.2f}): speedup "
                 f"{b['ms_step'] / r['ms_step']:.2f}x")
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--gen", type=int, nargs="+", default=[256, 512])
  ap.add_argument("--prompt", type=int, nargs="+", default=[768],
                  help="prompt lengths (several: the long-context rows)")
  ap.add_argument("--per-step", type=int, default=None,
                  help="tokens committed per step (the fixed rule; default "
                  "4; Fast-dLLM v2's rows commit one)")
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--small-block", type=int, default=8,
                  help="Fast-dLLM v2's sub-block (the reference's default)")
  ap.add_argument("--block-m", type=int, default=16)
  ap.add_argument("--only", nargs="*", default=None, help="strategy names")
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--model", default="llada-8b",
                  choices=("llada-8b", "sdar-4b", "sdar-8b",
                           "fast-dllm-v2-7b"),
                  help="published shapes (random weights); its family's "
                  "strategies run")
  ap.add_argument("--baseline-max-batch", type=int, default=1,
                  help="the largest batch the uncached baseline runs at")
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--json", type=Path, default=None)
  ap.add_argument("--steady", action="store_true",
                  help="also decode with twice --per-step tokens per step: "
                  "the time difference over the step difference is the "
                  "steady step, without the first step's prefill")
  ap.add_argument("--kv-cache-dtype", default="auto",
                  choices=model_cache.KV_CACHE_DTYPES,
                  help="the Flash-Cache samplers' KV cache storage")
  quantize.add_flags(ap)
  tuning.add_args(ap)
  tuning.add_variant_args(ap)
  args = ap.parse_args(argv)
  kernels = tuning.apply(ap, args)  # before any trace
  choices = tuning.variants(ap, args, kernels)
  t_start = time.perf_counter()  # progress lines: where a cut run was
  arch = ModelConfig.preset(args.model).arch
  if arch == "fast_dllm_v2" and args.per_step not in (None, 1):
    ap.error("--per-step: Fast-dLLM v2's rows commit one token a step "
             "(threshold 1 over tied confidences); set --small-block instead")
  args.per_step = args.per_step or (1 if arch == "fast_dllm_v2" else 4)
  if args.smoke:
    # d_model 128: a whole group of 128 inputs for int8-g128
    cfg = ModelConfig.tiny(arch, dtype="bfloat16", **(
        dict(d_model=128, n_heads=8) if args.quantize else {}))
    args.batch, args.gen, args.reps = [2], [32], 1
    args.baseline_max_batch = 2
    # the tiny model's context: prompts scaled down 64 times (16 by default)
    args.prompt = ([16] if args.prompt == ap.get_default("prompt")
                   else [max(8, p // 64) for p in args.prompt])
    args.block, args.block_m = 16, 8
    args.per_step = min(args.per_step, 4)  # gen 32 in blocks of 16
    args.small_block = min(args.small_block, 4)
    bw, mm = timing.copy_bandwidth(0.01, 3), timing.matmul_rate(256, 3)
  else:
    cfg = ModelConfig.preset(args.model)
    bw, mm = timing.copy_bandwidth(), timing.matmul_rate()
  cfg = cfg.replace(fused_qkv=tuning.fused_qkv(args))
  # quantized on device from the random bf16 weights, leaf by leaf
  params = timing.bench_params(cfg, quantize=args.quantize,
                               quantize_head=args.quantize_head,
                               quantize_embedding=args.quantize_embedding)
  if args.quantize:
    cfg = cfg.replace(quantize=args.quantize,
                      quantize_head=args.quantize_head,
                      quantize_embedding=args.quantize_embedding)
  if arch == "fast_dllm_v2":
    params = v2_schedule.tied_params(params)
  wbytes = quantize.weight_bytes(params)
  mm_kind = "bf16"
  if cfg.quantize and quantize.activations(cfg.quantize) == "fp8":
    # W8A8: the projections run fp8 x fp8 GEMMs, so fp8's rate is their
    # ceiling (bf16's would put the floor above what the step measures)
    mm = (qmatmul_bench.fp8_matmul_rate(256, 3) if args.smoke
          else qmatmul_bench.fp8_matmul_rate())
    mm_kind = "fp8"
  print(f"weights in memory: {wbytes / 1e9:.2f} GB ({wbytes:,} bytes, "
        f"{cfg.quantize or 'bf16'}"
        f"{', LM head too' if cfg.quantize_head else ''}"
        f"{', embedding too' if cfg.quantize_embedding else ''})")
  print(f"[{time.perf_counter() - t_start:.0f} s] "
        f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"copy {bw / 1e12:.2f} TB/s, {mm_kind} matmul {mm / 1e12:.0f} TFLOP/s; "
        f"{args.per_step} tokens per step"
        f"{f', sub-blocks of {args.small_block}' if arch == 'fast_dllm_v2' else ''}"
        f"; KV cache {args.kv_cache_dtype}")
  rows, failed = [], []
  limit = memory_limit()
  for gen, prompt in itertools.product(args.gen, args.prompt):
    # the steady step's second schedule: twice the tokens a step, or half
    # where twice would pass the Flash-Cache budget (block_m)
    # (Fast-dLLM v2: the same schedule over half the gen, whole blocks)
    k2 = (2 * args.per_step if 2 * args.per_step <= args.block_m
          else max(1, args.per_step // 2))
    gen2 = gen // 2 // args.block * args.block
    doubled = (strategies(gen2, 1, args.block, args.block_m, cfg.n_layers,
                          arch, args.kv_cache_dtype, args.small_block)
               if arch == "fast_dllm_v2" else
               strategies(gen, k2, args.block, args.block_m,
                          cfg.n_layers, arch, args.kv_cache_dtype))
    for name, build in strategies(
        gen, args.per_step, args.block, args.block_m, cfg.n_layers, arch,
        args.kv_cache_dtype, args.small_block).items():
      if args.only and name not in args.only:
        continue
      sampler, passes = build()
      for b, (label, kernels) in itertools.product(args.batch, choices):
        if name.endswith("-uncached") and b > args.baseline_max_batch:
          continue
        what = (f"{name} batch {b} {label or 'default'} (prompt {prompt}, "
                f"gen {gen})")
        n = prompt + gen + tail_length(sampler)
        cache = cache_bytes(cfg, b, n, args.kv_cache_dtype)
        if limit is not None and cache + wbytes > limit:
          # cannot fit whatever the program does: say so, spend no compile
          failed.append(what)
          print(f"FAILED {what}: does not fit: its KV cache alone is "
                f"{cache / 1e9:.1f} GB, with the weights' {wbytes / 1e9:.1f} "
                f"GB past the allocator's {limit / 1e9:.1f} GB", flush=True)
          continue
        print(f"[{time.perf_counter() - t_start:.0f} s] {what}: compile and "
              "decode", flush=True)
        try:  # one kernel choice that cannot run leaves the others' rows
          ms_step, compile_s, steps, forwards = timing.time_decode(
              cfg, params, sampler, b, prompt, args.reps,
              implementation=kernels)
          steady_ms = None
          kinds, tokens_step = passes(prompt, steps, forwards)
          if args.steady and (arch != "fast_dllm_v2" or gen2 >= args.block):
            ms2, _, steps2, _ = timing.time_decode(
                cfg, params, doubled[name]()[0], b, prompt, args.reps,
                implementation=kernels)
            steady_ms = ((ms_step * steps - ms2 * steps2) / (steps - steps2)
                         * 1e3)
        except Exception as e:  # noqa: BLE001 -- reported, not a result
          failed.append(what)
          print(f"FAILED {failed[-1]}: {type(e).__name__}: {str(e)[:2000]}",
                flush=True)
          continue
        # Each pass reads every weight once: a floor per pass, counted as
        # often as it ran a step (the busiest row's forwards).
        read_s = wbytes / bw
        flop_s = [timing.forward_flops(cfg, b, q, n) / mm for q, _ in kinds]
        floor = sum(max(read_s, f) * c for f, (_, c) in zip(flop_s, kinds))
        bound = "/".join(dict.fromkeys(  # the kinds of the passes that ran
            "compute" if f > read_s else "weights"
            for f, (_, c) in zip(flop_s, kinds) if c > 0))
        step_ms = steady_ms or ms_step * 1e3
        rows.append(dict(strategy=name, kernels=label, batch=b,
                         kv_cache_dtype=args.kv_cache_dtype,
                         prompt=prompt, gen=gen, steps=steps,
                         forwards=forwards, ms_step=ms_step * 1e3,
                         # [query tokens, forwards of the row] a pass kind
                         passes=[[q, round(c * steps)] for q, c in kinds],
                         steady_ms_step=steady_ms,
                         floor_ms=floor * 1e3, read_floor_ms=read_s * 1e3,
                         compile_s=compile_s,
                         bound=bound, tokens_s=b * tokens_step / step_ms * 1e3,
                         cache_gb=cache / 1e9,
                         peak_gb=None if (peak := timing.peak_memory_bytes())
                         is None else peak / 1e9))  # None: no memory stats
        print(rows[-1], flush=True)  # a run cut short keeps what it measured
        if args.json:
          args.json.write_text(json.dumps(dict(
              copy_Bps=bw, matmul_flops=mm, matmul_kind=mm_kind,
              weight_bytes=wbytes,
              quantize=cfg.quantize, quantize_head=cfg.quantize_head,
              quantize_embedding=cfg.quantize_embedding,
              rows=rows), indent=1))
  print("\n| strategy | kernels | batch | prompt | gen | steps | forwards | "
        "ms/step | steady ms/step | roofline ms/step | roofline / measured "
        "(steady) | bound | tokens/s | compile s | KV cache GB | peak GB |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    steady, of_steady = "–", ""
    if r["steady_ms_step"] is not None:
      steady = f"{r['steady_ms_step']:.2f}"
      of_steady = f" ({r['floor_ms'] / r['steady_ms_step']:.0%})"
    print(f"| {r['strategy']} | {r['kernels'] or 'default'} | {r['batch']} | "
          f"{r['prompt']} | {r['gen']} | {r['steps']} | "
          f"{r['forwards']} | {r['ms_step']:.2f} | {steady} | "
          f"{r['floor_ms']:.2f} | {r['floor_ms'] / r['ms_step']:.0%}"
          f"{of_steady} | {r['bound']} | {r['tokens_s']:.0f} | "
          f"{r['compile_s']:.1f} | {r['cache_gb']:.2f} | "
          f"{'–' if r['peak_gb'] is None else format(r['peak_gb'], '.2f')} |")
  for line in read_rates(rows, bw):
    print(line)
  for line in baseline_ratios(rows):
    print(line)
  if failed:  # the rows above stand; the run as a whole did not finish
    sys.exit(f"FAILED (no row): {'; '.join(failed)}")

if __name__ == "__main__":
  main()
