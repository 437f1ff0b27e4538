"""Paths the tests share."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A 123k-parameter random LLaDA-format checkpoint (scripts/
# make_tiny_checkpoint.py): the fast fixture for pipeline tests. The shipped
# default model (cli.DEFAULT_CHECKPOINT) is tested in test_shipped_model.py.
TINY_CHECKPOINT = ROOT / "checkpoints" / "tiny-random-llada"
