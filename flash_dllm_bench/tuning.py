"""Benchmark options that change how the decode loops compile: XLA options
for GPUs and the attention kernel's tiling rules. Applied before the first
trace; they are process-wide, so only benchmark scripts set them."""

from __future__ import annotations

import argparse


def add_args(ap: argparse.ArgumentParser) -> None:
  ap.add_argument("--gpu-option", action="append", default=[],
                  metavar="KEY=VALUE", help="add to generate.GPU_COMPILER_"
                  "OPTIONS for this run (e.g. xla_gpu_enable_cublaslt=true): "
                  "the decode loops' XLA options, which XLA_FLAGS does not "
                  "reach")
  ap.add_argument("--split-target", type=int, default=None,
                  help="attention kernel: programs per sequence that pick its "
                  "key splits (default: kernel.SPLIT_TARGET)")
  ap.add_argument("--attention-max-block-r", type=int, default=None,
                  help="attention kernel: most rows (query x folded head) "
                  "per program (default: kernel.MAX_BLOCK_R)")


def apply(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """Validates the options (ap.error on a bad one) and sets them."""
  from flash_dllm_jax.generate import GPU_COMPILER_OPTIONS
  from pallas_kernels.attention import kernel as attention_kernel
  options = {}
  for option in args.gpu_option:
    key, sep, value = option.partition("=")
    if not sep or not key.startswith("xla_gpu_"):
      ap.error(f"--gpu-option {option!r}: expected xla_gpu_NAME=VALUE")
    options[key] = {"true": True, "false": False}.get(
        value.lower(), int(value) if value.lstrip("-").isdigit() else value)
  if args.split_target is not None and args.split_target < 1:
    ap.error("--split-target must be >= 1")
  r = args.attention_max_block_r
  if r is not None and (r < 16 or r & (r - 1)):
    ap.error(f"--attention-max-block-r must be a power of two >= 16, got {r}")
  GPU_COMPILER_OPTIONS.update(options)
  if args.split_target is not None:
    attention_kernel.SPLIT_TARGET = args.split_target
  if r is not None:
    attention_kernel.MAX_BLOCK_R = r
