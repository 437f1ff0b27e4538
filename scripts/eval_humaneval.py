#!/usr/bin/env python
"""Evaluates a checkpoint on HumanEval (pass@1); see --help and
flash_dllm_jax/eval/cli.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_dllm_jax.eval.cli import main  # noqa: E402

if __name__ == "__main__":
  sys.exit(main(["humaneval", *sys.argv[1:]]))
