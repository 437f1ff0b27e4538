"""Command line: `python -m flash_dllm_jax generate --prompt "..."` (and
`serve`, flash_dllm_jax/serve/cli.py).

Every strategy of flash_dllm_jax/strategies.py is a `--strategy` choice and
every sampler field some strategy takes a flag. Prompts come from --prompt
(repeatable), --prompt-file (text lines, or JSON lines with "prompt" or
"messages"; '-' reads stdin) or stdin. JAX's persistent compilation cache
is on (see --compile-cache), so a repeated command does not compile again;
the last stderr line says what was compiled and what was loaded from the
cache. Without a command the program prints its help (exit status 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flash_dllm_jax import (architectures, cli_io, compilation, quantize,
                            strategies, strategy_flags)
from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.cli_flags import (CHECKPOINT_ENV,  # noqa: F401
                                      DEFAULT_CHECKPOINT, add_checkpoint_flag,
                                      add_compile_cache_flags,
                                      check_checkpoint, default_checkpoint,
                                      start_compile_cache)
from flash_dllm_jax.generate import generate
from flash_dllm_jax.ops import choice
from flash_dllm_jax.parallel import parse_mesh
from flash_dllm_jax.sampling import checks
from flash_dllm_jax.serve import cli as serve_cli

DESCRIPTION = ("Fast inference for diffusion LLMs in JAX (families: "
               f"{', '.join(architectures.names())}): generate answers or "
               "serve an OpenAI-compatible API.")
# The other entry points, as the top-level --help lists them (run with
# `python`; scripts/ is in the source tree, not in an installed package).
ENTRY_POINTS = (
    ("-m flash_dllm_jax.lm_eval", "lm-eval with the flash_dllm_jax model"),
    ("scripts/convert_hf.py", "Hugging Face directory -> checkpoint"),
    ("scripts/eval_gsm8k.py", "GSM8K accuracy"),
    ("scripts/eval_humaneval.py", "HumanEval pass@1 (sandboxed tests)"),
    ("scripts/eval_report.py", "table and plot over evaluation runs"),
    ("scripts/eval_quality.py", "every strategy on synthetic GSM"),
    ("scripts/lm_eval_quality.py", "the same through lm-eval"),
    ("scripts/compare_runs.py", "two evaluation runs, answer by answer"),
    ("scripts/bench_strategies.py", "decode step time per strategy"),
    ("scripts/bench_moe.py", "LLaDA2 (MoE) decode steps and one MoE layer"),
    ("scripts/bench_diffusion_gemma.py",
     "DiffusionGemma's denoising pass at 26B-A4B shapes"),
    ("scripts/bench_loglikelihood.py",
     "lm-eval's Monte-Carlo log-likelihood cost per request"),
    ("scripts/bench_forward.py", "forward and reference-decode times"),
    ("scripts/bench_kernels.py", "Pallas kernels against XLA"),
    ("scripts/bench_report.py", "tables from bench_kernels.py results"),
    ("scripts/bench_continuous.py", "continuous against static batches"),
    ("scripts/bench_serve.py", "the server under Poisson load"),
    ("scripts/bench_mesh.py", "data- and tensor-parallel scaling"),
    ("scripts/bench_mesh_diffusion_gemma.py",
     "DiffusionGemma's pass on meshes against one device"),
    ("scripts/bench_flash_mesh.py",
     "LLaDA2-flash steps on meshes against the per-GPU floor"),
    ("scripts/bench_block_attention.py",
     "block-causal attention: split kernel against fused"),
    ("scripts/decode_buffers.py", "a compiled decode's largest buffers"),
    ("scripts/bench_load.py", "checkpoint load time and host memory"),
    ("scripts/profile_step.py", "a decode step's time per kernel"),
    ("scripts/quant_error.py", "8-bit weights' error against bf16"),
    ("scripts/train_tiny.py", "train the shipped models"),
    ("scripts/make_synthetic_gsm.py", "write the synthetic GSM corpus"),
    ("scripts/make_tiny_checkpoint.py", "write the tiny random model"),
)


def _epilog() -> str:
  width = max(len(c) for c, _ in ENTRY_POINTS) + len("python ")
  rows = [f"  {'python ' + c:<{width}}  {d}" for c, d in ENTRY_POINTS]
  return ("other entry points (each takes --help; scripts/ is in the "
          "source tree):\n" + "\n".join(rows))


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
      prog="python -m flash_dllm_jax", description=DESCRIPTION,
      epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="command", metavar="{generate,serve}")
  gen = sub.add_parser("generate", help="generate answers for prompts")
  add_checkpoint_flag(gen)
  gen.add_argument("--strategy", default=None, metavar="NAME",
                   help="decoding strategy: "
                        + "; ".join(f"{s.name}: {s.help}" for s in
                                    strategies.STRATEGIES.values())
                        + " (default: the architecture's reference sampler)")
  gen.add_argument("--prompt", action="append", default=None,
                   help="a prompt; repeat for a batch")
  gen.add_argument("--prompt-file", type=Path, default=None,
                   help="prompts, one per line, or JSON lines with 'prompt' "
                        "(a string) or 'messages' (a chat); '-' for stdin")
  gen.add_argument("--chat", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="apply the chat template to plain prompts (default: "
                        "when the checkpoint has one; chats always use it)")
  gen.add_argument("--output", choices=["text", "json", "jsonl"],
                   default="text", help="stdout format (default: text)")
  gen.add_argument("--batch-size", type=int, default=None,
                   help="prompts decoded at a time (continuous batching for "
                        "the strategies that refill slots: "
                        f"{', '.join(strategies.refilling())}; default: 32, "
                        "or all at once with --mesh)")
  gen.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="compute dtype (default: the checkpoint's)")
  quantize.add_flags(gen)
  gen.add_argument("--seed", type=int, default=0,
                   help="random seed of every prompt's draws (sampling, "
                        "random remasking), an int in [0, 2**32); the same "
                        "seed gives the same answers (default: 0)")
  choice.add_flags(gen)
  gen.add_argument("--mesh", default=None,
                   help="device mesh: data=D splits the batch, model=M the "
                        "weights and KV cache (tensor parallel), e.g. "
                        "data=2,model=2")
  gen.add_argument("--no-stop-at-eos", dest="stop_at_eos",
                   action="store_false", help="decode every position")
  gen.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress lines on stderr")
  add_compile_cache_flags(gen)
  strategy_flags.add_option_flags(gen)
  serve_cli.add_parser(sub)
  return ap


def _generate(args) -> int:
  prompts = cli_io.read_prompts(args.prompt, args.prompt_file)
  kernels = choice.kernels_from_args(args)
  batch_size = args.batch_size or (None if args.mesh else 32)
  if args.batch_size is not None and args.batch_size < 1:
    raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
  checks.check_seeds([args.seed], "--seed")
  checkpoint = args.checkpoint or default_checkpoint()
  check_checkpoint(checkpoint, args.checkpoint is not None)
  start_compile_cache(args)
  mesh = parse_mesh(args.mesh)
  params, config, tokenizer = load(checkpoint, dtype=args.dtype, mesh=mesh,
                                   quantize=args.quantize,
                                   quantize_head=args.quantize_head,
                                   quantize_embedding=args.quantize_embedding)
  name = args.strategy or config.spec.default_strategy
  sampler, sampling = strategies.build(name, config.arch,
                                       strategy_flags.options_from_args(args))
  t0 = time.perf_counter()
  with compilation.compile_log() as compiled:
    progress = cli_io.Progress(len(prompts), args.progress, compiled)
    out = generate((params, config, tokenizer), prompts, sampler=sampler,
                   sampling=sampling, chat=args.chat, seed=args.seed,
                   stop_at_eos=args.stop_at_eos, batch_size=batch_size,
                   mesh=mesh, progress=progress, kernels=kernels)
  seconds = time.perf_counter() - t0
  meta = {"checkpoint": str(checkpoint), "arch": config.arch,
          "strategy": name, "compile_seconds": round(compiled.spent(), 4)}
  cli_io.write(args.output, prompts, out, config, progress.seconds_B,
               seconds, meta)
  print(f"[{config.arch}, {out.steps} steps, {int(out.forwards_B.max())} "
        f"forwards, strategy {name}; {compiled.describe(seconds)}]",
        file=sys.stderr)
  return 0


def main(argv: list[str] | None = None) -> int:
  ap = _parser()
  args, extra = ap.parse_known_args(argv)
  if args.command is None and not extra:
    ap.print_help()  # to stdout: help asked for by giving no command
    return 0
  if args.command is None:
    ap.error(f"unrecognized arguments: {' '.join(extra)} (choose a command: "
             "generate or serve)")
  if extra:
    known = ", ".join("--" + k.replace("_", "-")
                      for k in strategies.all_options())
    print(f"error: unknown option(s) {' '.join(extra)}; strategy options: "
          f"{known} (--help lists the rest)", file=sys.stderr)
    return 2
  if args.command == "serve":
    return args.main(args)
  try:
    return _generate(args)
  except (ValueError, FileNotFoundError, TypeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
