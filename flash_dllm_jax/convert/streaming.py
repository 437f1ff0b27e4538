"""Loading a Hugging Face checkpoint directory straight into device memory.

The same checks as the converter (files, headers, names, shapes, dtypes:
everything before a tensor is read), then each tensor is read from its
mapped safetensors shard, put in our layout and dtype, and moved to its
device(s) before the next one is read, so host memory holds about one
tensor at a time and nothing is written to disk. `convert_checkpoint`
remains the way to make the fast, shardable orbax copy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flax import traverse_util

from flash_dllm_jax import architectures, checkpoint_files, parallel
from flash_dllm_jax import quantize as quantized
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.convert import source

DEFAULT_DTYPE = "bfloat16"  # the converter's default


def is_hf_dir(path: str | Path) -> bool:
  """A directory with config.json and safetensors weights (one file or an
  index) and no manifest.json (which marks a converted checkpoint)."""
  path = Path(path)
  return (path.is_dir() and (path / "config.json").is_file()
          and not (path / "manifest.json").exists()
          and ((path / "model.safetensors").is_file()
               or (path / "model.safetensors.index.json").is_file()))


def hf_config(src: str | Path, dtype: str | None = None) -> ModelConfig:
  """The ModelConfig of an HF directory (its tokenizer gives the EOT id)."""
  return source.read_model(Path(src), dtype or DEFAULT_DTYPE)[1]


def load_hf(src: str | Path, dtype: str | None = None, mesh=None,
            quantize: str | None = None, quantize_head: bool = False,
            quantize_embedding: bool = False):
  """(params, config, tokenizer) of the HF directory `src`, as `load`
  returns them for its converted copy (`dtype` default bfloat16, as the
  converter's). mesh: each weight goes straight onto its shards.
  quantize: each projection (with quantize_head the LM head, with
  quantize_embedding the embedding) is quantized on device as soon as it
  is placed (see checkpoint.load)."""
  src = Path(src).absolute()
  dtype = dtype or DEFAULT_DTYPE
  model_type, config, tokenizer = source.read_model(src, dtype)
  table = architectures.get(config.arch).name_table()
  plan = source.plan_tensors(source.read_headers(src), table, config,
                             model_type)
  config = checkpoint_files.quantized_config(config, quantize, quantize_head,
                                       str(src), embedding=quantize_embedding)
  if quantize is not None:
    source.check_quantizable(plan, config)
  mesh = parallel.parse_mesh(mesh)
  parallel.check_config(config, mesh)
  np_dtype = np.dtype(dtype)
  flat, stacks = {}, source.Stacks()
  for shard, mapped in plan.items():
    for m in mapped:
      complete = stacks.add(m, source.read_tensor(src / shard, m, config,
                                                  np_dtype))
      for param_path, host in complete.items():
        array = checkpoint_files.placed(config, param_path, host, mesh)
        del host
        if quantize is None:
          flat[param_path] = array
          continue
        for path, new in quantized.quantize_leaf(config, param_path,
                                                 array).items():
          flat[path] = checkpoint_files.placed(config, path, new, mesh)
        del array
  return traverse_util.unflatten_dict(flat, sep="/"), config, tokenizer
