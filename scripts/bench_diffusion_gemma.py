"""DiffusionGemma's denoising pass at 26B-A4B shapes, against its floor.

Random weights at the DiffusionGemma_26B_A4B preset's geometry (bf16, or
8-bit with --quantize fp8|int8; the tied embedding stays bf16), a cache
holding a prompt of each --prompt tokens (zero K/V: the work does not depend on the values), and one canvas of
--canvas tokens denoised against it: the self-conditioned canvas forward
(diffusion_gemma/fast.py, the sampler's default, compiled with the decode
loop's XLA options) at each --batch, timed as ms per pass (the median of
--reps passes, the cache donated and written in place as in the loop).
Beside it, measured in the same run:

- the floor: the larger of two, at the copy rate and the bf16 matmul
  rate measured in this run: the bytes one pass must read (every weight: at T >= 256
  tokens each of X experts is idle with probability (1 - k/X)^T < 1e-7,
  so the floor counts the expected experts hit, X (1 - (1 - k/X)^T); the
  tied table read by the head; the K/V slots the canvas can see: C + W - 1
  per local layer, prompt + C per global one), and its matmul FLOPs (k
  experts a token; the head over the whole vocabulary: batch 32 is
  compute-bound);
- the peak device memory so far (`device.memory_stats()`; JAX may take
  95% of the card unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise);
- tokens/s: batch * canvas / (steps * pass), the --steps fixed denoising
  passes a canvas takes (the causal append of the canvas, one forward per
  canvas, not counted);
- the baseline: the row-by-row reference forward (forward="rows": every
  expert on every row, the whole cache) at each --baseline-batch, its ratio
  to the fast pass of the same batch.

A configuration whose estimated memory (weights, cache, float32 logits
and their intermediates) exceeds 92% of the device's is skipped and
reported as such.

  python scripts/bench_diffusion_gemma.py --json OUT/dg.json
  python scripts/bench_diffusion_gemma.py --quantize fp8 --baseline-batch
  python scripts/bench_diffusion_gemma.py --smoke   # tiny, any backend
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The 26B weights take most of an 80 GB card: JAX's default share (75%)
# would not hold them with a batch's cache.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma import fast  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma import model as M  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma import quant  # noqa: E402
from flash_dllm_jax.architectures.diffusion_gemma.checkpoint import (  # noqa: E402
    param_shapes)
from flash_dllm_jax.architectures.diffusion_gemma.config import (  # noqa: E402
    LOCAL, GemmaConfig, preset)
from flash_dllm_jax.compilation import compiler_options  # noqa: E402

PRESET = "DiffusionGemma_26B_A4B"
# The smoke's geometry: the tiny official test checkpoint's, 6 layers.
TINY = dict(num_embed=160, embed_dim=32, hidden_dim=48, num_heads=4,
            head_dim=8, num_kv_heads=2, final_logit_softcap=8.0,
            use_post_attn_norm=True, use_post_ffw_norm=True,
            attention_types=["LOCAL_SLIDING", "LOCAL_SLIDING", "GLOBAL"] * 2,
            sliding_window_size=4, num_global_kv_heads=1, global_key_size=16,
            k_eq_v_global=True, global_rope_proportion=0.25,
            global_base_frequency=1_000_000, enable_moe=True, num_experts=4,
            expert_dim=16, top_k_experts=2, moe_dense_hidden_dim=48)


def layer_params(config: GemmaConfig, prefix: str, pool, fmt, index):
  """The random weights under `prefix` (bf16 leaves tiled from one normal
  pool, scaled 1/sqrt(fan_in); 1-D leaves ones), 8-bit ones quantized
  right away (memory peaks near one layer's bf16 weights)."""
  from flax import traverse_util
  shapes = {p: s for p, s in sorted(param_shapes(config).items())
            if p.startswith(prefix + "/")}
  flat = {}
  for i, (path, shape) in enumerate(shapes.items()):
    if len(shape) == 1:
      flat[path] = jnp.ones(shape, jnp.bfloat16)
      continue
    fan_in = shape[-1] if "gating" in path or "q_einsum" in path else (
        shape[-2])
    offset = ((index * 97 + i) * 104_729) % pool.size
    flat[path] = timing._tiled_leaf(tuple(shape), jnp.dtype(jnp.bfloat16),
                                    None)(pool, jnp.uint32(offset),
                                          jnp.float32(fan_in ** -0.5))
  tree = traverse_util.unflatten_dict(flat, sep="/")[prefix]
  if fmt is None or prefix == "embedder":
    return tree
  if prefix == "self_conditioner":
    one = config.replace(layer_kinds=(LOCAL,))
    return quant.quantize_tree({prefix: tree, "layer_0": layer_params(
        one, "layer_0", pool, None, 0)}, one, fmt)[prefix]
  one = config.replace(layer_kinds=(config.layer_kinds[index],))
  sc = {"ffw": {}}  # quantize_tree's self-conditioner: nothing to do here
  return quant.quantize_tree({"self_conditioner": sc, "layer_0": tree}, one,
                             fmt)["layer_0"]


def bench_params(config: GemmaConfig, fmt: str | None):
  pool = jax.random.normal(jax.random.key(0), (1 << 22,), jnp.float32)
  params = {"embedder": layer_params(config, "embedder", pool, None, 0),
            "final_norm": {"scale": jnp.ones((config.d_model,),
                                             jnp.bfloat16)},
            "self_conditioner": layer_params(config, "self_conditioner",
                                             pool, fmt, 0)}
  for i in range(config.n_layers):
    params[f"layer_{i}"] = layer_params(config, f"layer_{i}", pool, fmt, i)
  return params


def nbytes(tree) -> int:
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def slot_bytes(config: GemmaConfig, kind: str) -> int:
  """bf16 K and V bytes of one cache slot of one `kind` layer."""
  return 2 * 2 * config.kv_heads(kind) * config.key_size(kind)


def floor_bytes(config, params, b: int, prompt: int, c: int) -> float:
  """Bytes one canvas pass must read (module docstring)."""
  x, k = config.moe_experts, config.moe_top_k
  experts = sum(nbytes(params[f"layer_{i}"]["mlp"][n])
                for i in range(config.n_layers)
                for n in ("gating_einsum", "linear")) if x else 0
  hit = x * (1 - (1 - k / x) ** (b * c)) / x if x else 0.0
  kv = sum(slot_bytes(config, kind) * (
      min(prompt + c, c + config.sliding_window - 1) if kind == LOCAL
      else prompt + c) for kind in config.layer_kinds)
  return nbytes(params) - experts + hit * experts + b * kv


def pass_flops(config: GemmaConfig, b: int, prompt: int, c: int) -> float:
  """Matmul FLOPs of one canvas pass (2 per multiply-add): per token the
  projections, the dense and the k chosen experts' MLPs, scores and values
  over the visible keys, the self-conditioning MLP and the head."""
  d, n = config.d_model, config.n_heads
  per_token = 2 * 3 * d * config.sc_width + 2 * d * config.vocab_size
  for kind in config.layer_kinds:
    h, kv = config.key_size(kind), config.kv_heads(kind)
    keys = (min(prompt + c, c + config.sliding_window - 1) if kind == LOCAL
            else prompt + c)
    proj = d * h * (2 * n + kv * (1 if config.k_eq_v(kind) else 2))
    mlp = 3 * d * config.mlp_hidden + (
        config.moe_top_k * 3 * d * config.moe_hidden + d * config.moe_experts
        if config.moe_experts else 0)
    per_token += 2 * (proj + mlp + 2 * n * h * keys)
  return b * c * per_token


def memory_estimate(config, params, b: int, length: int, c: int) -> float:
  """Weights, the cache, the float32 logits and the head's bf16 product."""
  cache = sum(slot_bytes(config, kind) for kind in config.layer_kinds)
  return nbytes(params) + b * (length * cache + c * config.vocab_size * 6)


def pass_runner(config, params, forward, b: int, prompt: int, c: int):
  """(run, compile seconds): run() does one canvas pass at slots
  prompt .. prompt + c - 1 of a cache of prompt + c slots, in place."""
  fn = jax.jit(lambda p, t, s, cache, sc: forward(p, config, t, s, cache,
                                                  M.canvas(s), sc),
               donate_argnums=(3,), compiler_options=compiler_options())
  tokens = jax.random.randint(jax.random.key(1), (b, c), 0,
                              config.vocab_size)
  slots = jnp.broadcast_to(prompt + jnp.arange(c), (b, c))
  sc = jax.random.normal(jax.random.key(2), (b, c, config.d_model),
                         jnp.bfloat16)
  # zero K/V: the pass's work and bytes do not depend on their values
  state = {"cache": M.empty_cache(config, b, prompt + c, jnp.bfloat16)}
  t0 = time.perf_counter()
  compiled = fn.lower(params, tokens, slots, state["cache"], sc).compile()
  compile_s = time.perf_counter() - t0

  def run():
    logits, state["cache"] = compiled(params, tokens, slots, state["cache"],
                                      sc)
    return logits
  return run, compile_s


FORWARDS = {"fast": fast.forward, "rows": M.forward_rows}


def kernels(text: str | None):
  """--expert-tiling 'tile_m,block_n,block_k[,num_warps,num_stages]' ->
  an ops.Kernels for fast.forward (None: the engine's default)."""
  if text is None:
    return None
  from flash_dllm_jax import ops
  names = ("tile_m", "block_n", "block_k", "num_warps", "num_stages")
  try:
    values = [int(v) for v in text.split(",")]
    if not 3 <= len(values) <= 5:
      raise ValueError("3 to 5 integers")
    return ops.Kernels(experts=ops.ExpertTiling(**dict(zip(names, values))))
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"tiling {text!r}: {e}") from None


def measure(config, params, name, b, prompt, c, steps, reps, rates):
  run, compile_s = pass_runner(config, params, FORWARDS[name], b, prompt, c)
  seconds = timing.time_fn(run, reps=reps, warmup=1)
  copy_Bps, matmul_flops = rates
  read_s = floor_bytes(config, params, b, prompt, c) / copy_Bps
  compute_s = pass_flops(config, b, prompt, c) / matmul_flops
  floor_s = max(read_s, compute_s)
  peak = timing.peak_memory_bytes()
  del run
  return dict(forward=name, batch=b, prompt=prompt, canvas=c,
              ms_per_pass=seconds * 1e3, floor_ms=floor_s * 1e3,
              read_floor_ms=read_s * 1e3, compute_floor_ms=compute_s * 1e3,
              floor_fraction=floor_s / seconds,
              tokens_per_s=b * c / (steps * seconds),
              peak_gb=None if peak is None else peak / 1e9,
              compile_s=compile_s)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
  ap.add_argument("--prompt", type=int, nargs="+", default=[768, 4096])
  ap.add_argument("--canvas", type=int, default=256)
  ap.add_argument("--steps", type=int, default=16,
                  help="fixed denoising passes per canvas (tokens/s)")
  ap.add_argument("--baseline-batch", type=int, nargs="*", default=[1],
                  help="batches the row-by-row reference also runs at")
  ap.add_argument("--quantize", choices=("fp8", "int8"), default=None)
  ap.add_argument("--reps", type=int, default=8)
  ap.add_argument("--expert-tiling", type=kernels, default=None,
                  help="the grouped expert GEMM's tile_m,block_n,block_k"
                       "[,num_warps,num_stages] (default: the engine's)")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny model and shapes: checks the script runs")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)

  if args.expert_tiling is not None:
    FORWARDS["fast"] = functools.partial(fast.forward,
                                         implementation=args.expert_tiling)
  if args.smoke:
    config = GemmaConfig.from_official(TINY, dtype="bfloat16")
    args.batch, args.prompt, args.canvas = [2], [12], 6
    args.baseline_batch, args.reps = [2], 2
    copy_Bps = timing.copy_bandwidth(0.01, 3)
    matmul_flops = timing.matmul_rate(256, 3)
  else:
    config = preset(PRESET)
    copy_Bps, matmul_flops = timing.copy_bandwidth(), timing.matmul_rate()
  config = config.replace(quantize=args.quantize)
  t0 = time.perf_counter()
  params = bench_params(config, args.quantize)
  jax.block_until_ready(params)
  device = jax.devices()[0]
  limit = (device.memory_stats() or {}).get("bytes_limit")
  print(f"device: {device.device_kind}; jax {jax.__version__}; "
        f"{PRESET if not args.smoke else 'tiny'} weights "
        f"{args.quantize or 'bf16'}: {nbytes(params) / 1e9:.2f} GB "
        f"(built in {time.perf_counter() - t0:.0f} s); device memory "
        f"{'?' if limit is None else f'{limit / 1e9:.1f} GB'}")
  print(f"ceilings measured now: copy {copy_Bps / 1e9:.1f} GB/s, bf16 "
        f"matmul {matmul_flops / 1e12:.1f} TFLOP/s (floor: the larger of "
        "the pass's bytes and FLOPs at these rates)")
  print("| forward | prompt | batch | ms/pass | read floor ms | FLOP floor "
        "ms | % of floor | tokens/s | peak GB | vs rows |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  rows = []

  def save():  # after every row: a run cut short keeps what it measured
    if args.json:
      args.json.parent.mkdir(parents=True, exist_ok=True)
      args.json.write_text(json.dumps(dict(
          device=device.device_kind, jax=jax.__version__,
          weights=args.quantize or "bf16", weight_gb=nbytes(params) / 1e9,
          copy_GBps=copy_Bps / 1e9, matmul_TFLOPs=matmul_flops / 1e12,
          canvas=args.canvas, steps=args.steps,
          rows=rows), indent=1))

  for prompt in args.prompt:
    for b in args.batch:
      need = memory_estimate(config, params, b, prompt + args.canvas,
                             args.canvas)
      if limit is not None and need > 0.92 * limit:
        print(f"| fast | {prompt} | {b} | skipped: needs ~{need / 1e9:.0f} "
              f"GB of {limit / 1e9:.0f} |")
        rows.append(dict(forward="fast", batch=b, prompt=prompt,
                         skipped_need_gb=need / 1e9))
        save()
        continue
      got = []
      for name in ("fast", "rows")[:1 + (b in args.baseline_batch)]:
        try:
          got.append(measure(config, params, name, b, prompt, args.canvas,
                             args.steps, args.reps if name == "fast" else
                             max(2, args.reps // 4),
                             (copy_Bps, matmul_flops)))
        except Exception as e:  # out of memory: say so, run the rest
          line = str(e).strip().splitlines()[0][:200]
          print(f"| {name} | {prompt} | {b} | failed: {line} |", flush=True)
          rows.append(dict(forward=name, batch=b, prompt=prompt,
                           failed=line))
      if len(got) == 2 and got[1]["forward"] == "rows":
        got[0]["speedup_vs_rows"] = got[1]["ms_per_pass"] / got[0][
            "ms_per_pass"]
      for r in got:
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.1f}"
        vs = r.get("speedup_vs_rows")
        print(f"| {r['forward']} | {prompt} | {b} | {r['ms_per_pass']:.2f} | "
              f"{r['read_floor_ms']:.2f} | {r['compute_floor_ms']:.2f} | "
              f"{100 * r['floor_fraction']:.0f}% | "
              f"{r['tokens_per_s']:.0f} | {peak} | "
              f"{'-' if vs is None else f'{vs:.2f}x'} |", flush=True)
      rows.extend(got)
      save()
  return rows


if __name__ == "__main__":
  main()
