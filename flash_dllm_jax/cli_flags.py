"""Flags and checks every command shares (generate, serve, eval): where the
checkpoint is and JAX's persistent compilation cache. A leaf of the
commands: they import it, it imports none of them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from flash_dllm_jax import architectures
from flash_dllm_jax.compilation import (CACHE_ENV, default_cache_dir,
                                        enable_persistent_cache)

CHECKPOINT_ENV = "FLASH_DLLM_JAX_CHECKPOINT"
DEFAULT_CHECKPOINT = (Path(__file__).resolve().parents[1] / "checkpoints"
                      / "synthetic-gsm-llada-16m")


def default_checkpoint() -> Path:
  """$FLASH_DLLM_JAX_CHECKPOINT, else the shipped model in the source tree."""
  env = os.environ.get(CHECKPOINT_ENV)
  return Path(env).expanduser() if env else DEFAULT_CHECKPOINT


def check_checkpoint(path: Path, given: bool) -> None:
  """One line saying where the model was expected and how to point at it."""
  if given or path.exists():
    return
  raise FileNotFoundError(
      f"no checkpoint at {path} (the shipped model lives in checkpoints/"
      "synthetic-gsm-llada-16m of the source tree, which a non-editable "
      f"install does not copy); pass --checkpoint DIR or set {CHECKPOINT_ENV}")


def add_checkpoint_flag(ap: argparse.ArgumentParser) -> None:
  ap.add_argument("--checkpoint", type=Path, default=None,
                  help="checkpoint directory: converted, or a Hugging Face "
                       "directory of a family: "
                       f"{', '.join(architectures.names())} (default: "
                       f"${CHECKPOINT_ENV}, else {DEFAULT_CHECKPOINT})")


def add_compile_cache_flags(ap: argparse.ArgumentParser) -> None:
  ap.add_argument("--compile-cache", type=Path, default=None, metavar="DIR",
                  help="JAX's persistent compilation cache (default: "
                       f"${CACHE_ENV}, else {default_cache_dir() or 'off'})")
  ap.add_argument("--no-compile-cache", action="store_true",
                  help=f"compile everything afresh (or {CACHE_ENV}=off)")


def start_compile_cache(args) -> None:
  if not args.no_compile_cache:
    enable_persistent_cache(args.compile_cache or default_cache_dir())
