"""The scheduled attention kernel's default tiling: rows per program and key
splits, as rules of the shapes alone (never of the batch size)."""

import dataclasses

from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How `scheduled_attention` tiles by default (static: part of the jit key).

  split_target: programs one sequence should fill before its keys are split
    (see default_splits). Splits cost a float32 partial output per split and
    a merge; the count may not depend on the batch, so the default serves
    batch 32: LLaDA-8B's queries (32 heads) are never split at 32, a sequence
    with fewer programs (Dream's 4 KV heads at small Q) still is
    (BENCHMARKS.md, "Strategy steps").
  max_block_r: most rows (query x folded head) per program, a power of two.
  block_k: keys per tile, a power of two >= 16.
  num_stages: Triton pipeline depth of the key loop.
  """

  split_target: int = 32
  max_block_r: int = 64
  block_k: int = 64
  num_stages: int = 3

  def __post_init__(self):
    if not isinstance(self.split_target, int) or self.split_target < 1:
      raise ValueError(f"split_target must be an int >= 1, got "
                       f"{self.split_target!r}")
    r = self.max_block_r
    if not isinstance(r, int) or r < 16 or r & (r - 1):
      raise ValueError(f"max_block_r must be a power of two >= 16, got {r!r}")
    k = self.block_k
    if not isinstance(k, int) or k < 16 or k & (k - 1):
      raise ValueError(f"block_k must be a power of two >= 16, got {k!r}")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"num_stages must be an int >= 1, got "
                       f"{self.num_stages!r}")


DEFAULT_TILING = Tiling()


def default_splits(kh, n_rt, s, block_k, target=DEFAULT_TILING.split_target):
  """Key splits so one sequence alone runs about `target` programs, each
  split keeping at least 4 key tiles.

  Deliberately blind to the batch size: the splits fix the order in which a
  row sums its keys, so a batch-dependent count would make a row's bf16
  result (and near-tied tokens) depend on how many rows share the call.
  """
  return max(1, min(pl.cdiv(target, kh * n_rt), s // (4 * block_k)))


def _default_block_r(rr, max_r=DEFAULT_TILING.max_block_r):
  """Rows per program for rr = Q * J rows of one (sequence, kv head)."""
  return min(max_r, max(16, 1 << (rr - 1).bit_length()))


def splits_for(q_shape, k_cache_shape, block_r=None, block_k=None,
               tiling: Tiling = DEFAULT_TILING):
  """The key splits `scheduled_attention` picks by default for queries
  [B, Q, H, D] over a cache [B, S, K, D].

  Under tensor parallelism each device runs the kernel on its own heads;
  given the global shapes, this is the count one device would take, and
  passing it as num_splits keeps each row's key-sum order mesh-independent.
  """
  _, q, h, _ = q_shape
  s, kh = k_cache_shape[1:3]
  rr = q * (h // kh)
  n_rt = pl.cdiv(rr, block_r or _default_block_r(rr, tiling.max_block_r))
  return default_splits(kh, n_rt, s, block_k or tiling.block_k,
                        tiling.split_target)
