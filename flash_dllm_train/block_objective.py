"""The block-diffusion objective of block-causal models (LLaDA2).

A row is cut into decode blocks of `block_length` counted from its first
token, as the LLaDA2 sampler counts them. Each step of that sampler denoises
one block while the earlier blocks are clean, so training shows every block
exactly that view in one forward (BD3LM's two-copy layout, the one
inclusionAI's LLaDA2 training uses): the noised row x_t and the clean row
x_0 side by side, 2N tokens with the positions of the row twice, and the
mask

  x_t query of block b  sees  x_t keys of block b, x_0 keys of blocks < b
  x_0 query of block b  sees  x_0 keys of blocks <= b (x_0 never sees x_t)

so the clean copy computes the keys the sampler's cache holds and the noised
copy the block being decoded. The noise and loss are LLaDA's (objective.py):
one t per row, response tokens masked with probability t, cross-entropy on
the masked tokens of x_t weighted 1/t and divided by the response length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def two_copy_mask(valid_BxN: jax.Array, blocks_BxN: jax.Array) -> jax.Array:
  """[B, 2N, 2N] bool: which of the 2N keys ([x_t; x_0]) each query sees."""
  q_blk, k_blk = blocks_BxN[:, :, None], blocks_BxN[:, None, :]
  valid = valid_BxN[:, None, :]
  noisy_noisy = valid & (k_blk == q_blk)
  noisy_clean = valid & (k_blk < q_blk)
  clean_clean = valid & (k_blk <= q_blk)
  top = jnp.concatenate([noisy_noisy, noisy_clean], axis=2)
  bottom = jnp.concatenate([jnp.zeros_like(clean_clean), clean_clean], axis=2)
  return jnp.concatenate([top, bottom], axis=1)


def two_copy_logits(model, params, noisy_BxN, tokens_BxN, positions_BxN,
                 valid_BxN, block_length: int):
  """(the x_t copy's logits [B, N, V] in float32, the forward's
  intermediates) of the two-copy forward (`model` a Transformer)."""
  n = tokens_BxN.shape[1]
  mask = two_copy_mask(valid_BxN, positions_BxN // block_length)
  rows_BxN = jnp.broadcast_to(jnp.arange(n), tokens_BxN.shape)
  (logits_BxNxV, _), state = model.apply(
      {"params": params}, jnp.concatenate([noisy_BxN, tokens_BxN], axis=1),
      jnp.concatenate([positions_BxN, positions_BxN], axis=1), mask,
      logit_rows_BxR=rows_BxN, mutable=["intermediates"])
  return logits_BxNxV, state
