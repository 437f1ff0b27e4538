"""Writes a tiny random-weight checkpoint (the placeholder default model).

  python scripts/make_tiny_checkpoint.py checkpoints/tiny-random-llada --arch llada

Weights are random (seeded): the model exercises the whole pipeline but its
answers are meaningless until a trained model replaces it.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from flash_dllm_jax.checkpoint import save  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.model import init_params  # noqa: E402
from flash_dllm_jax.tokenizer import build_tiny_tokenizer  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dst", type=Path)
  ap.add_argument("--arch", choices=["llada", "dream"], default="llada")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--force", action="store_true")
  args = ap.parse_args(argv)
  tokenizer, ids = build_tiny_tokenizer(args.arch, 384)
  config = ModelConfig.tiny(args.arch, vocab_size=384, **ids)
  params = init_params(config, jax.random.key(args.seed), head_init_scale=4.0)
  save(args.dst, params, config, tokenizer, force=args.force)
  print(f"wrote {args.dst} ({config.num_params():,} parameters)")


if __name__ == "__main__":
  main()
