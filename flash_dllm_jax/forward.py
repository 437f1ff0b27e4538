"""`logits`: the model's uncached forward for given ids, for research use.

  model = flash_dllm_jax.load("checkpoints/DIR")
  out = flash_dllm_jax.logits(model, ids_BxN, hidden=True)
  out.logits_BxNxV      # float32 vocabulary logits of every position
  out.hidden_LxBxNxE    # residual stream after each of the L blocks

Attention is bidirectional over the valid keys. Logits are the raw rows:
for Dream (config.logits_shift == 1) the token at position i is predicted
by row i - 1, as in its reference code.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import unpack_model
from flash_dllm_jax.model import Transformer
from flash_dllm_jax.model.transformer import Block

PRECISIONS = ("default", "high", "highest")


class ForwardOutput(NamedTuple):
  """logits_BxNxV: float32. hidden_LxBxNxE: each block's output (the
  residual stream before the final norm), in the compute dtype, or None."""

  logits_BxNxV: jax.Array
  hidden_LxBxNxE: jax.Array | None


def default_positions(valid_BxN: np.ndarray) -> np.ndarray:
  """RoPE positions counted over each row's valid tokens (0 at its first),
  as generate counts them under left padding."""
  return np.maximum(np.cumsum(valid_BxN, axis=1) - 1, 0).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("config", "hidden",
                                             "implementation"))
def _forward(params, ids_BxN, positions_BxN, valid_BxN, blocks_BxN, *, config,
             hidden, implementation):
  model = Transformer(config, implementation=implementation)
  variables = {"params": params}
  if not hidden:
    logits, _ = model.apply(variables, ids_BxN, positions_BxN, valid_BxN,
                            blocks_BxQ=blocks_BxN)
    return logits, None
  (logits, _), state = model.apply(
      variables, ids_BxN, positions_BxN, valid_BxN, blocks_BxQ=blocks_BxN,
      capture_intermediates=lambda m, name: (isinstance(m, Block)
                                             and name == "__call__"))
  inter = state["intermediates"]
  blocks = [inter[f"layers_{i}"]["__call__"][0][0]
            for i in range(config.n_layers)]
  return logits, jnp.stack(blocks)


def logits(model, ids_BxN, positions=None, valid=None, *,
           config: ModelConfig | None = None, precision: str = "highest",
           dtype: str | None = None, hidden: bool = False,
           implementation: str | None = None,
           block_length: int | None = None) -> ForwardOutput:
  """The forward pass of `ids_BxN` (int array [B, N]).

  model: what `load` returns, or a params tree with `config=`.
  positions: RoPE positions [B, N]; default: counted over valid tokens.
  valid: bool [B, N], which keys may be attended to (False: padding);
    default: all. Rows at invalid positions are computed but meaningless.
  precision: matmul precision of the float32 products ('default', 'high',
    'highest'; 'highest' is what the parity tests use).
  dtype: compute dtype ('bfloat16', 'float32'); default: the config's.
  hidden: also return each block's output.
  implementation: kernel choice (flash_dllm_jax/ops/); default: the
    backend's.
  block_length: for block-causal architectures (LLaDA2), the decode block:
    a position sees its own block and earlier ones, blocks counted from
    position 0 (None: one block, every position sees every valid one).
  """
  params, config, _ = unpack_model(model, config)
  if precision not in PRECISIONS:
    raise ValueError(f"precision must be one of {PRECISIONS}, got "
                     f"{precision!r}")
  if dtype is not None:
    config = config.replace(dtype=dtype)
  ids = np.asarray(ids_BxN)
  if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"ids_BxN must be a 2-D integer array, got shape "
                     f"{ids.shape} and dtype {ids.dtype}")
  if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
    raise ValueError(f"ids_BxN has ids outside [0, {config.vocab_size})")
  valid_BxN = (np.ones(ids.shape, bool) if valid is None
               else np.asarray(valid, bool))
  positions_BxN = (default_positions(valid_BxN) if positions is None
                   else np.asarray(positions, np.int32))
  for name, array in (("valid", valid_BxN), ("positions", positions_BxN)):
    if array.shape != ids.shape:
      raise ValueError(f"{name} has shape {array.shape}, expected "
                       f"{ids.shape} (ids_BxN's)")
  if ids.shape[1] > config.max_seq_len:
    raise ValueError(f"{ids.shape[1]} positions exceed max_seq_len "
                     f"{config.max_seq_len}")
  blocks_BxN = None
  if block_length is not None:
    if not isinstance(block_length, int) or block_length < 1:
      raise ValueError(f"block_length must be a positive int, got "
                       f"{block_length!r}")
    blocks_BxN = jnp.asarray(positions_BxN // block_length)
  with jax.default_matmul_precision(precision):
    out = _forward(params, jnp.asarray(ids, jnp.int32),
                   jnp.asarray(positions_BxN), jnp.asarray(valid_BxN),
                   blocks_BxN, config=config, hidden=hidden,
                   implementation=implementation)
  return ForwardOutput(*out)
