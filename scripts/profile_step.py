"""Where a strategy's decode step spends device time, kernel by kernel.

The set-up of bench_strategies.py (random bf16 weights at the LLaDA-8B
geometry, the fixed commit rule), one decode traced with jax.profiler, and the
trace's device kernels summed by category and by name per loop step
(flash_dllm_bench/trace_summary.py). The first loop step is the prefill;
the per-step busy times of the other steps are reported apart from it.

  python scripts/profile_step.py --only flash-dllm --batch 1 32 --gen 512 \\
      --per-step 8 --out-dir OUT
  python scripts/profile_step.py --smoke --out-dir /tmp/p   # tiny model
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from flash_dllm_bench import timing, trace_summary, tuning  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_strategies import strategies  # noqa: E402


def profile_decode(go, log_dir: Path):
  """Runs go() once traced (it must be compiled already); returns
  (wall seconds, its output, the perfetto trace's path)."""
  t0 = time.perf_counter()
  with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
    out = jax.block_until_ready(go())
  return time.perf_counter() - t0, out, trace_summary.find_trace(log_dir)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", nargs="+", default=["flash-dllm"])
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--gen", type=int, default=512)
  ap.add_argument("--prompt", type=int, default=768)
  ap.add_argument("--per-step", type=int, default=8,
                  help="tokens committed per step (the fixed rule)")
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--block-m", type=int, default=16)
  ap.add_argument("--top", type=int, default=30)
  ap.add_argument("--keep-trace", action="store_true",
                  help="copy each perfetto trace into --out-dir")
  ap.add_argument("--out-dir", type=Path, required=True)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--label", default="", help="added to report headings")
  tuning.add_args(ap)
  args = ap.parse_args(argv)
  implementation = tuning.apply(ap, args)  # before any trace
  t_start = time.perf_counter()

  def progress(what):
    print(f"[{time.perf_counter() - t_start:.0f} s] {what}", flush=True)

  args.out_dir.mkdir(parents=True, exist_ok=True)
  if args.smoke:
    cfg = ModelConfig.tiny("llada", dtype="bfloat16")
    args.batch, args.gen, args.prompt, args.block_m = [2], 32, 16, 8
    args.per_step = min(args.per_step, args.block_m)
  else:
    cfg = ModelConfig.preset("llada-8b")
  cfg = cfg.replace(fused_qkv=tuning.fused_qkv(args))
  params = timing.bench_params(cfg)
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}",
        flush=True)
  built = strategies(args.gen, args.per_step, args.block, args.block_m,
                     cfg.n_layers)
  unknown = sorted(set(args.only) - set(built))
  if unknown:
    ap.error(f"unknown strategies {unknown}; choose from {sorted(built)}")
  reports = []
  for name in args.only:
    sampler = built[name]()[0]
    for b in args.batch:
      progress(f"{name} batch {b}: compile and decode")
      go = timing.decode_runner(cfg, params, sampler, b, args.prompt,
                                implementation=implementation)
      t0 = time.perf_counter()
      out = jax.block_until_ready(go())
      compile_s = time.perf_counter() - t0
      wall = timing.time_fn(go, reps=1, warmup=0)
      steps = int(out[2])
      progress(f"compiled in {compile_s:.0f} s; {steps} steps, "
               f"{wall * 1e3:.0f} ms a decode; tracing one")
      with tempfile.TemporaryDirectory() as tmp:
        traced_s, _, trace = profile_decode(go, Path(tmp))
        progress(f"traced ({trace.stat().st_size / 1e6:.0f} MB); reading it")
        kernels, lines = trace_summary.device_kernels(
            trace_summary.load_events(trace))
        tag = f"{args.label}{name}-b{b}-g{args.gen}"
        if args.keep_trace:
          shutil.copy(trace, args.out_dir / f"{tag}.perfetto.json.gz")
      summary = trace_summary.summarize(kernels)
      text = (f"## {args.label}{name}, batch {b}, gen {args.gen}, prompt {args.prompt}, "
              f"{args.per_step} tokens per step\n\n"
              f"{steps} loop steps; untraced decode {wall * 1e3:.1f} ms "
              f"({wall / steps * 1e3:.2f} ms per step; first call "
              f"{compile_s:.1f} s with compile); traced {traced_s * 1e3:.1f}"
              f" ms\ndevice lines seen: {lines}\n"
              + trace_summary.report(summary, steps, args.top,
                                     exclude_first=True))
      print(text, flush=True)
      reports.append(text)
      (args.out_dir / "profile.md").write_text("\n\n".join(reports) + "\n")


if __name__ == "__main__":
  main()
