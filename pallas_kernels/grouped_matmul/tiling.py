"""How the grouped GEMM tiles (static: part of the jit key)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Tiling:
  """tile_m: rows per tile, each tile one expert's (a power of two >= 16);
  fixed whatever the token count, so that a row's bits are. Larger tiles
  read each expert's weights fewer times, smaller ones pad less.
  block_n, block_k: output and input columns per step (powers of two >=
  16; shrunk to divide the widths). num_warps, num_stages: Triton's."""

  tile_m: int = 64
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3

  def __post_init__(self):
    for name in ("tile_m", "block_n", "block_k"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 16 or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {v!r}")
    for name in ("num_warps", "num_stages"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")

  def kernel_args(self) -> dict:
    """The kernel's keyword arguments besides tile_m."""
    return dict(block_n=self.block_n, block_k=self.block_k,
                num_warps=self.num_warps, num_stages=self.num_stages)
