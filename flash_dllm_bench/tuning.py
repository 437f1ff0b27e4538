"""Benchmark options that change how the decode loops compile: XLA options
for GPUs (process-wide, set before the first trace) and the attention
kernel's tiling rules (a `Kernels` the benchmark decodes with)."""

from __future__ import annotations

import argparse
import dataclasses

from flash_dllm_jax.ops import choice


def add_args(ap: argparse.ArgumentParser) -> None:
  ap.add_argument("--fused-qkv", choices=("auto", "on", "off"),
                  default="auto", help="one joined q/k/v projection per "
                  "layer (model/fuse.py); auto: on a GPU, as load() does")
  ap.add_argument("--gpu-option", action="append", default=[],
                  metavar="KEY=VALUE", help="add to generate.GPU_COMPILER_"
                  "OPTIONS for this run (e.g. xla_gpu_enable_cublaslt=true): "
                  "the decode loops' XLA options, which XLA_FLAGS does not "
                  "reach")
  choice.add_flags(ap)  # --attention-split-target N|auto, as generate's
  ap.add_argument("--attention-max-block-r", type=int, default=None,
                  help="attention kernel: most rows (query x folded head) "
                  "per program (default: Tiling().max_block_r)")
  ap.add_argument("--attention-block-k", type=int, default=None,
                  help="attention kernel: keys per tile (default: "
                  "Tiling().block_k)")
  ap.add_argument("--attention-split-tiles", type=int, default=None,
                  help="attention kernel: key tiles per split when keys are "
                  "split (default: Tiling().split_tiles); a batch-1 pass "
                  "writes a float32 partial per split, so longer splits "
                  "write fewer")
  ap.add_argument("--attention-stages", type=int, default=None,
                  help="attention kernel: pipeline stages (default: "
                  "Tiling().num_stages)")
  ap.add_argument("--stream-max-q", type=int, default=None,
                  help="8-bit weights: most query rows per sequence that "
                  "run the weight-streaming kernel, more go to XLA's GEMM "
                  "(default: ops.stream_max_q, by format)")
  ap.add_argument("--qmatmul-backend", choices=choice.GPU_BACKENDS,
                  default="triton", help="8-bit weights: the streaming "
                  "kernel's GPU backend (default: %(default)s)")
  add_block_attention_flag(ap)


def add_block_attention_flag(ap: argparse.ArgumentParser,
                             several: bool = False) -> None:
  """--block-attention default|fused|split (Kernels.block_attention;
  default: the Kernels default, split on a GPU); several: a list of them,
  each timed (default ["default"])."""
  from flash_dllm_jax import architectures
  block = [n for n in architectures.names()
           if architectures.get(n).attention.mask == "block_causal"]
  ap.add_argument("--block-attention", choices=("default",
                                                *choice.BLOCK_ATTENTIONS),
                  nargs="+" if several else None,
                  default=["default"] if several else "default",
                  help=f"block-causal attention ({', '.join(block)})"
                  + (", each timed" if several else "") + ": default (split "
                  "on a GPU, fused elsewhere), fused (JAX's fused attention) "
                  "or split (the scheduled kernel block by block)")


def block_attention(value: str) -> str | None:
  """Kernels.block_attention for a --block-attention value."""
  return None if value == "default" else value


def add_variant_args(ap: argparse.ArgumentParser) -> None:
  """--variants (read by `variants`), for scripts that loop over them."""
  ap.add_argument("--variants", nargs="+", default=None, metavar="SPEC",
                  help="time several kernel choices in one process (the "
                  "weights made once), each the options above changed by "
                  "SPEC: 'default', or comma-joined split=N|auto, "
                  "split-tiles=N, qmatmul=, cache= (the RoPE + cache "
                  "write), attention= (the cached attention), experts= "
                  "(the grouped expert GEMM) each triton|mosaic, "
                  "stream-max-q=N, block=fused|split (block-causal "
                  "attention)")


_VARIANT_KEYS = ("split", "split-tiles", "qmatmul", "cache", "attention",
                 "experts", "stream-max-q", "block")


def variants(ap: argparse.ArgumentParser, args: argparse.Namespace, base):
  """[(label, Kernels)]: --variants applied to `base` (apply's result);
  [("", base)] without the flag. ap.error names a bad SPEC."""
  if not getattr(args, "variants", None):
    return [("", base)]
  out = []
  for spec in args.variants:
    kernels = base
    for item in ([] if spec == "default" else spec.split(",")):
      key, sep, value = item.partition("=")
      if not sep or key not in _VARIANT_KEYS:
        ap.error(f"--variants {spec!r}: expected 'default' or "
                 f"KEY=VALUE items with KEY in {', '.join(_VARIANT_KEYS)}")
      try:
        if key == "split":
          tiling = dataclasses.replace(
              kernels.attention, **choice.split_rule(
                  choice.parse_split_target(value)))
          kernels = dataclasses.replace(kernels, attention=tiling)
        elif key == "split-tiles":
          kernels = dataclasses.replace(kernels, attention=dataclasses.replace(
              kernels.attention, split_tiles=int(value)))
        elif key == "qmatmul":
          kernels = dataclasses.replace(kernels, qmatmul=value)
        elif key == "cache":
          kernels = dataclasses.replace(kernels, cache_update=value)
        elif key == "attention":
          kernels = dataclasses.replace(kernels, attention_backend=value)
        elif key == "experts":
          kernels = dataclasses.replace(kernels, experts_backend=value)
        elif key == "block":
          kernels = dataclasses.replace(kernels, block_attention=value)
        else:
          kernels = dataclasses.replace(kernels, stream_max_q=int(value))
      except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(f"--variants {spec!r}: {e}")
    out.append((spec, kernels))
  return out


def apply(ap: argparse.ArgumentParser, args: argparse.Namespace):
  """Validates the options (ap.error on a bad one), adds the XLA options and
  returns the kernel choice to decode with (`implementation=`)."""
  from flash_dllm_jax.generate import GPU_COMPILER_OPTIONS
  from flash_dllm_jax.ops import Kernels
  options = {}
  for option in args.gpu_option:
    key, sep, value = option.partition("=")
    if not sep or not key.startswith("xla_gpu_"):
      ap.error(f"--gpu-option {option!r}: expected xla_gpu_NAME=VALUE")
    options[key] = {"true": True, "false": False}.get(
        value.lower(), int(value) if value.lstrip("-").isdigit() else value)
  if args.stream_max_q is not None and args.stream_max_q < 0:
    ap.error("--stream-max-q must be >= 0")
  split = args.attention_split_target
  if split is not None and split != "auto" and split < 1:
    ap.error("--attention-split-target must be >= 1")
  r = args.attention_max_block_r
  if r is not None and (r < 16 or r & (r - 1)):
    ap.error(f"--attention-max-block-r must be a power of two >= 16, got {r}")
  GPU_COMPILER_OPTIONS.update(options)
  default = choice.default_tiling()
  try:
    tiling = dataclasses.replace(
        default, **choice.split_rule(split),
        max_block_r=r or default.max_block_r,
        block_k=args.attention_block_k or default.block_k,
        split_tiles=(default.split_tiles if args.attention_split_tiles is None
                     else args.attention_split_tiles),
        num_stages=args.attention_stages or default.num_stages)
  except ValueError as e:
    ap.error(str(e))
  return Kernels(attention=tiling, stream_max_q=args.stream_max_q,
                 qmatmul=args.qmatmul_backend,
                 block_attention=block_attention(args.block_attention))


def fused_qkv(args: argparse.Namespace) -> bool:
  """Whether the benchmark's model joins q/k/v (--fused-qkv)."""
  from flash_dllm_jax.model.fuse import joins_by_default
  if args.fused_qkv == "auto":
    return joins_by_default()
  return args.fused_qkv == "on"
