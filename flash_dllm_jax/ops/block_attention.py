"""Block-causal attention: its mask (BlockCausal) and its run on the
scheduled (split) kernel decode block by decode block, the path whose key
sums a whole-window forward and a cached forward of one block share."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from flash_dllm_jax import parallel
from flash_dllm_jax.ops.choice import (device_sm_count, kernel_name,
                                      tiling as tiling_of)
from pallas_kernels.attention import api as attention_api


@struct.dataclass
class BlockCausal:
  """A block-causal mask, not materialised: key s is visible to query q when
  valid and its decode block is not after q's (bidirectional inside a
  block, causal across). key_valid_BxS, key_blocks_BxS [B, S] (blocks
  non-decreasing over slots); blocks_BxQ [B, Q] the queries' blocks.
  block_length and rows_BxQ (each query's row in its block, -1 for a
  padding query, whose output is zero) given, the kernel path attends
  block by block (`attention`)."""

  key_valid_BxS: jax.Array
  key_blocks_BxS: jax.Array
  blocks_BxQ: jax.Array
  rows_BxQ: jax.Array | None = None
  block_length: int | None = struct.field(pytree_node=False, default=None)

  def mask(self, blocks_BxC: jax.Array | None = None) -> jax.Array:
    """[B, C, S] visibility for queries of blocks blocks_BxC (None: all)."""
    blocks_BxC = self.blocks_BxQ if blocks_BxC is None else blocks_BxC
    return self.key_valid_BxS[:, None, :] & (
        self.key_blocks_BxS[:, None, :] <= blocks_BxC[:, :, None])


def blockwise_attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
                        v_BxSxKxD: jax.Array, mask: BlockCausal, *,
                        scale: float,
                        implementation: str | None = None) -> jax.Array:
  """Block-causal attention as the scheduled (split) kernel runs it: the
  queries go to a buffer of C = (Q + L - 2) // L + 1 decode blocks of L
  rows (L = mask.block_length; each at its row mask.rows_BxQ of its block,
  block b0 + c at c, b0 the row's first), and each block's rows attend to
  cache slots [0, end of the block) minus the invalid ones, the cache read
  in place by all C blocks (kv_repeat). The key splits are right-anchored
  at the block's end with a size that follows (L, heads) alone: a query's
  sum over keys has the same order in a whole-window forward and in a
  cached forward of its block, whatever the batch, the cache length or
  the other queries of the call, so the two give the same bits. A call's
  queries hold consecutive positions (so at most C blocks a row).
  Returns o_BxQxHxD (zero for padding queries)."""
  b, q, h, d = q_BxQxHxD.shape
  l = mask.block_length
  c = (q + l - 2) // l + 1
  ok_BxQ = mask.rows_BxQ >= 0
  first_B = jnp.min(jnp.where(ok_BxQ, mask.blocks_BxQ,
                              jnp.iinfo(jnp.int32).max), axis=1)
  first_B = jnp.where(jnp.any(ok_BxQ, axis=1), first_B, 0)
  c_BxQ = mask.blocks_BxQ - first_B[:, None]
  at_BxQ = jnp.where(ok_BxQ, c_BxQ * l + mask.rows_BxQ, c * l)
  rows = jnp.arange(b)[:, None]
  q_BxXxHxD = jnp.zeros((b, c * l, h, d), q_BxQxHxD.dtype).at[
      rows, at_BxQ].set(q_BxQxHxD, mode="drop")
  end_BxC = jax.vmap(lambda kb, bl: jnp.searchsorted(kb, bl, side="right"))(
      mask.key_blocks_BxS, first_B[:, None] + jnp.arange(c))
  has_BxC = jnp.zeros((b, c), bool).at[rows, jnp.where(ok_BxQ, c_BxQ, c)].set(
      True, mode="drop")
  q_len_BxC = jnp.where(has_BxC, l, 0).astype(jnp.int32)
  impl = kernel_name(implementation)
  tiling = tiling_of(implementation)
  split_tiles = attention_api.split_tiles_for((b, l, h, d), k_BxSxKxD.shape,
                                              tiling=tiling)
  if tiling.group_target is None:  # a window's C blocks would each keep a
    # float32 partial per split (memory ~ S^2): grouped, which no bit sees
    tiling = dataclasses.replace(tiling, group_target=2 * device_sm_count())

  def attend(q_BxXxHxD, k, v, end_BxC, q_len_BxC, exclude_BxS):
    bb, _, hh, _ = q_BxXxHxD.shape
    o, _ = attention_api.scheduled_attention(
        q_BxXxHxD.reshape(bb * c, l, hh, d), k, v, end_BxC.reshape(-1),
        q_len_BxC.reshape(-1), scale=scale, exclude_BxS=exclude_BxS,
        implementation=impl, kv_repeat=c, split_tiles=split_tiles,
        tiling=tiling)
    return o.reshape(bb, c * l, hh, d)

  mesh = parallel.active_mesh()
  if mesh is not None:
    heads, rows_spec = parallel.HEADS_SPEC, P("data")
    attend = parallel.shard_map(
        attend, mesh, (heads, heads, heads, rows_spec, rows_spec, rows_spec),
        heads)
  o_BxXxHxD = attend(q_BxXxHxD, k_BxSxKxD, v_BxSxKxD,
                     end_BxC.astype(jnp.int32), q_len_BxC,
                     ~mask.key_valid_BxS)
  o_BxQxHxD = o_BxXxHxD[rows, jnp.minimum(at_BxQ, c * l - 1)]
  return jnp.where(ok_BxQ[:, :, None, None], o_BxQxHxD, 0).astype(
      q_BxQxHxD.dtype)
