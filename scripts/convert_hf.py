#!/usr/bin/env python
"""Converts a Hugging Face checkpoint directory (config.json, safetensors
shards, tokenizer files) into a flash_dllm_jax checkpoint."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_dllm_jax import architectures, quantize  # noqa: E402
from flash_dllm_jax.convert import (ConversionError,  # noqa: E402
                                    convert_checkpoint)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=(
      f"{__doc__.strip()} Families: {', '.join(architectures.names())}."))
  parser.add_argument("src_dir", help="the Hugging Face checkpoint directory "
                      "(its config.json's model_type names the family)")
  parser.add_argument("dst_dir", help="the new checkpoint directory")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"),
                      default="bfloat16", help="stored parameter dtype")
  quantize.add_flags(parser, writes=True)
  parser.add_argument("--force", action="store_true",
                      help="replace dst_dir if it exists (after success)")
  args = parser.parse_args(argv)
  try:
    convert_checkpoint(args.src_dir, args.dst_dir, dtype=args.dtype,
                       force=args.force, quantize=args.quantize,
                       quantize_head=args.quantize_head,
                       quantize_embedding=args.quantize_embedding)
  except ConversionError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
