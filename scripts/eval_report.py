#!/usr/bin/env python
"""Rebuilds results.md and the accuracy/throughput plot over the runs in a
folder: python scripts/eval_report.py runs/eval/gsm8k"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_dllm_jax.eval.cli import main  # noqa: E402

if __name__ == "__main__":
  sys.exit(main(["report", *sys.argv[1:]]))
