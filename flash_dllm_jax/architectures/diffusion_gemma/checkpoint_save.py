"""Writing Google's DiffusionGemma format (checkpoint.py reads it): the
orbax parameter tree and its config.json, from a loaded model or from a
Hugging Face directory."""

from __future__ import annotations

import json
from pathlib import Path

import orbax.checkpoint as ocp

from flash_dllm_jax.architectures.diffusion_gemma import hf as hf_format
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    GEMMA4_SPECIAL, GemmaConfig)
from flash_dllm_jax.checkpoint_files import staging_dir


def save(dst, params, config: GemmaConfig, tokenizer=None,
         force: bool = False) -> None:
  """Writes `params` (the official tree) in Google's format at `dst`: the
  orbax tree, config.json ("transformer_config", "special_tokens",
  "max_seq_len", the compute "dtype", "text_vocab_size" when the config
  sets one) and the tokenizer's files; all or nothing."""
  with staging_dir(dst, force=force) as tmp:
    tmp.rmdir()  # orbax writes the directory itself
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp.absolute(), params)
    checkpointer.wait_until_finished()
    special = dict(GEMMA4_SPECIAL, eos=config.eos_token_id,
                   bos=config.bos_token_id, end_of_turn=config.end_of_turn_id,
                   begin_of_tool_response=config.tool_response_id)
    meta = {"transformer_config": hf_format.to_official(config),
            "special_tokens": special, "max_seq_len": config.max_seq_len,
            "dtype": config.dtype}
    if config.text_vocab_size is not None:
      meta["text_vocab_size"] = config.text_vocab_size
    (tmp / "config.json").write_text(json.dumps(meta, indent=1) + "\n")
    if tokenizer is not None:
      tokenizer.save(tmp)


def convert(src, dst, dtype: str = "bfloat16", force: bool = False) -> None:
  """A Hugging Face DiffusionGemma directory written in Google's format."""
  if not hf_format.is_hf_dir(Path(src)):
    raise ValueError(f"{src} is not a Hugging Face DiffusionGemma directory "
                     "(config.json of model_type 'diffusion_gemma' with "
                     "safetensors)")
  params, config = hf_format.load(Path(src), dtype)
  save(dst, params, config, force=force)
