"""Command line: `python -m flash_dllm_jax generate --prompt "..."`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_CHECKPOINT = (Path(__file__).resolve().parents[1] / "checkpoints"
                      / "synthetic-gsm-llada-16m")

# Sampler options exposed as flags: (flag, type, help).
_OPTIONS = [
    ("gen_length", int, "tokens to generate"),
    ("steps", int, "decoding steps"),
    ("block_length", int, "LLaDA: semi-autoregressive block length"),
    ("temperature", float, "sampling temperature (0 = greedy)"),
    ("cfg_scale", float, "LLaDA: classifier-free guidance scale"),
    ("remasking", str, "LLaDA: low_confidence or random"),
    ("alg", str, "Dream: origin, maskgit_plus, topk_margin or entropy"),
    ("eps", float, "Dream: final timestep"),
    ("top_p", float, "Dream: nucleus sampling mass"),
    ("top_k", int, "Dream: top-k sampling"),
    ("alg_temp", float, "Dream: temperature of the position choice"),
]
_FLAGS = [("logits_eos_inf", "LLaDA: never predict EOS"),
          ("confidence_eos_eot_inf", "LLaDA: EOS/EOT get zero confidence")]


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m flash_dllm_jax")
  sub = ap.add_subparsers(dest="command", required=True)
  gen = sub.add_parser("generate", help="generate answers for prompts")
  gen.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT,
                   help="converted checkpoint directory (default: %(default)s)")
  gen.add_argument("--prompt", action="append", required=True,
                   help="a prompt; repeat for a batch")
  gen.add_argument("--chat", action=argparse.BooleanOptionalAction,
                   default=True, help="apply the chat template")
  gen.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="compute dtype (default: the checkpoint's)")
  gen.add_argument("--seed", type=int, default=0)
  gen.add_argument("--mesh", default=None,
                   help="device mesh: data=D splits the batch, model=M the "
                        "weights and KV cache (tensor parallel), e.g. "
                        "data=2,model=2")
  gen.add_argument("--no-stop-at-eos", dest="stop_at_eos",
                   action="store_false", help="decode every position")
  for name, typ, help_ in _OPTIONS:
    gen.add_argument("--" + name.replace("_", "-"), type=typ, default=None,
                     help=help_)
  for name, help_ in _FLAGS:
    gen.add_argument("--" + name.replace("_", "-"), action="store_true",
                     default=None, help=help_)
  from flash_dllm_jax.serve.cli import add_parser as add_serve
  add_serve(sub, DEFAULT_CHECKPOINT)
  return ap


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  if args.command == "serve":
    return args.main(args)
  from flash_dllm_jax.checkpoint import load
  from flash_dllm_jax.generate import generate

  options = {name: getattr(args, name) for name, *_ in _OPTIONS + _FLAGS
             if getattr(args, name) is not None}
  try:
    from flash_dllm_jax.parallel import parse_mesh
    mesh = parse_mesh(args.mesh)
    params, config, tokenizer = load(args.checkpoint, dtype=args.dtype,
                                     mesh=mesh)
    t0 = time.perf_counter()
    out = generate((params, config, tokenizer), args.prompt, chat=args.chat,
                   seed=args.seed, stop_at_eos=args.stop_at_eos,
                   mesh=mesh, **options)
  except (ValueError, FileNotFoundError, TypeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  seconds = time.perf_counter() - t0
  for prompt, text in zip(args.prompt, out.texts):
    print(f">>> {prompt}\n{text}\n")
  print(f"[{config.arch}, {out.steps} steps, {int(out.forwards_B.max())} "
        f"forwards, {seconds:.2f} s including compilation]", file=sys.stderr)
  return 0
