"""The scheduled attention kernel's default tiling: rows per program and key
splits, as rules of the shapes alone (never of the batch size; whether and
in how many tiles a split runs, never of the cache length), and how many
splits one program runs (split groups), the one choice that follows the
batch size: it changes no arithmetic."""

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

# Left padding of the keys by a multiple of PAD_ALIGN slots (excluded, k_len
# grown by as much) leaves every row's result unchanged, bit for bit: key
# tiles start at slot 0 and block_k divides PAD_ALIGN, so real keys keep
# their tiles, and key splits are right-anchored (see split_range).
PAD_ALIGN = 64


def check_block_k(block_k):
  """ValueError unless block_k is 16, 32 or 64 (a power of two >= 16 that
  divides PAD_ALIGN)."""
  k = block_k
  if not isinstance(k, int) or k < 16 or k & (k - 1) or PAD_ALIGN % k:
    raise ValueError(f"block_k must be a power of two >= 16 dividing "
                     f"PAD_ALIGN={PAD_ALIGN} (16, 32 or 64), got {k!r}: "
                     f"larger key tiles would make a row's result depend "
                     f"on its left padding")


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How `scheduled_attention` tiles by default (static: part of the jit key).

  split_target: programs one sequence should fill before its keys are split
    (see default_split_tiles). Whether to split may depend on neither the
    batch nor the cache length. At 32 (this class's default) LLaDA-8B's
    queries (32 heads) are never split and a sequence with fewer programs
    (Dream's 4 KV heads at small Q) still is: 5 splits of 4 tiles at
    S = 1280. At 132 (an H100's or H200's SMs) LLaDA-8B splits too
    (Q <= 256), also into 5 at S = 1280.
  group_target: programs a call should not exceed by running its key splits
    in separate programs (see split_group_for): a program runs a group of
    consecutive splits one after another, each from a fresh softmax, so
    the group changes the program count and not a bit of any result, and
    may follow the batch size. None: one split per program, each writing a
    float32 partial that the combine kernel merges. With split_target = the
    device's SM count and group_target twice it (the automatic rule the
    entry points default to), batch 1 runs LLaDA-8B's splits in parallel
    or nearly (at 128 queries its 5 splits in 3 programs a row tile, 192
    in all) and batch 32 runs them in one program per row tile, which
    merges them itself and writes no partials (kernel.py): one rule for
    both, the same bits for any batch size.
  split_tiles: key tiles per split when keys are split (a fixed size, so
    that a longer cache only adds splits).
  max_block_r: most rows (query x folded head) per program, a power of two.
  block_k: keys per tile: 16, 32 or 64 (it must divide PAD_ALIGN).
  num_stages: Triton pipeline depth of the key loop.
  """

  split_target: int = 32
  group_target: int | None = None
  split_tiles: int = 4
  max_block_r: int = 64
  block_k: int = 64
  num_stages: int = 3

  def __post_init__(self):
    for name in ("split_target", "split_tiles", "num_stages"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    v = self.group_target
    if v is not None and (not isinstance(v, int) or v < 1):
      raise ValueError(f"group_target must be None or an int >= 1, got {v!r}")
    r = self.max_block_r
    if not isinstance(r, int) or r < 16 or r & (r - 1):
      raise ValueError(f"max_block_r must be a power of two >= 16, got {r!r}")
    check_block_k(self.block_k)


DEFAULT_TILING = Tiling()


def default_split_tiles(kh, n_rt, s, block_k, tiling=DEFAULT_TILING):
  """Key tiles per split: tiling.split_tiles when one sequence alone runs
  fewer than tiling.split_target programs (kh * n_rt), else all
  cdiv(s, block_k) tiles (one split).

  Whether to split is blind to the batch size and to s: the splits fix the
  order in which a row sums its keys, so a batch-dependent choice would make
  a row's bf16 result (and near-tied tokens) depend on how many rows share
  the call, and an s-dependent one would make it depend on left padding.
  """
  if pl.cdiv(tiling.split_target, kh * n_rt) > 1:
    return tiling.split_tiles
  return pl.cdiv(s, block_k)


def split_count(s, block_k, split_tiles):
  """Static number of key splits of split_tiles tiles over s slots."""
  return pl.cdiv(pl.cdiv(s, block_k), split_tiles)


def split_range(n_tiles, split, splits, split_tiles):
  """Tiles [t0, t1) of key split `split` for a row of n_tiles key tiles.

  Right-anchored: the last split ends at the row's last tile, so left
  padding of the keys only adds leading splits of pad tiles (which the
  online softmax and the merge pass through exactly). n_tiles may be traced.
  """
  t1 = n_tiles - (splits - 1 - split) * split_tiles
  return jnp.maximum(t1 - split_tiles, 0), jnp.maximum(t1, 0)


def split_group_for(batch, kh, n_rt, splits, programs=None):
  """Key splits per program: the smallest group such that batch * kh * n_rt
  * cdiv(splits, group) programs do not exceed `programs` (all splits in
  one program when even that exceeds it; None: 1).

  Batch-dependent, yet a row's result is not: every split still runs from a
  fresh online-softmax state and is merged in the same order with the same
  step (combine.merge_step), in the kernel when one program holds all of a
  row tile's splits, else by the combine kernel over their partials.
  """
  if programs is None or splits <= 1:
    return 1
  per_split = max(1, programs // (batch * kh * n_rt))
  return pl.cdiv(splits, per_split)


def key_splits(b, kh, n_rt, s, block_k, split_tiles=None, num_splits=None,
               split_group=None, tiling=DEFAULT_TILING):
  """(split_tiles, splits, group) for `scheduled_attention`'s arguments:
  split_tiles given, or from num_splits (about that many over s), or
  default_split_tiles; group given (at most splits), or split_group_for of
  batch b and tiling.group_target. ValueError for bad values."""
  if num_splits is not None:
    if split_tiles is not None or num_splits < 1:
      raise ValueError(f"num_splits ({num_splits}) must be >= 1 and not "
                       f"given with split_tiles ({split_tiles})")
    split_tiles = pl.cdiv(pl.cdiv(s, block_k), num_splits)
  elif split_tiles is None:
    split_tiles = default_split_tiles(kh, n_rt, s, block_k, tiling)
  elif split_tiles < 1:
    raise ValueError(f"split_tiles must be >= 1, got {split_tiles}")
  splits = max(1, split_count(s, block_k, split_tiles))
  if split_group is None:
    split_group = split_group_for(b, kh, n_rt, splits, tiling.group_target)
  elif not isinstance(split_group, int) or split_group < 1:
    raise ValueError(f"split_group must be an int >= 1, got {split_group!r}")
  return split_tiles, splits, min(split_group, splits)


def _default_block_r(rr, max_r=DEFAULT_TILING.max_block_r):
  """Rows per program for rr = Q * J rows of one (sequence, kv head)."""
  return min(max_r, max(16, 1 << (rr - 1).bit_length()))


def split_tiles_for(q_shape, k_cache_shape, block_r=None, block_k=None,
                    tiling: Tiling = DEFAULT_TILING):
  """The key tiles per split `scheduled_attention` takes by default for
  queries [B, Q, H, D] over a cache [B, S, K, D].

  Under tensor parallelism each device runs the kernel on its own heads;
  given the global shapes, this is the split size one device would take,
  and passing it as split_tiles keeps each row's key-sum order
  mesh-independent (a shard's fewer heads could otherwise ask for splits).
  """
  _, q, h, _ = q_shape
  s, kh = k_cache_shape[1:3]
  rr = q * (h // kh)
  n_rt = pl.cdiv(rr, block_r or _default_block_r(rr, tiling.max_block_r))
  return default_split_tiles(kh, n_rt, s, block_k or tiling.block_k, tiling)
