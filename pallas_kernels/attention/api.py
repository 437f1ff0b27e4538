"""Public entry: scheduled attention, Pallas kernel or plain-JAX reference."""

import jax
import jax.numpy as jnp

from pallas_kernels.attention import (fused, kernel, kv_quant, reference,
                                      tiling)
from pallas_kernels.common import resolve_implementation

# 'mosaic' / 'mosaic_interpret': the Mosaic GPU kernel (mosaic.py), never
# the default; what it does not take falls through to 'pallas' /
# 'pallas_interpret'.
IMPLEMENTATIONS = ("pallas", "pallas_interpret", "mosaic", "mosaic_interpret",
                   "reference")

exclude_mask_from_positions = reference.exclude_mask_from_positions
sum_heads = reference.sum_heads
split_tiles_for = tiling.split_tiles_for
PAD_ALIGN = tiling.PAD_ALIGN
Tiling = tiling.Tiling


def masked_attention(q_BxQxHxD: jax.Array, k_BxSxKxD: jax.Array,
                     v_BxSxKxD: jax.Array, key_valid_BxS: jax.Array, *,
                     scale: float, implementation: str = "reference"):
  """Bidirectional GQA attention of all queries over all valid keys.

  implementation: 'fused' (`fused.fused_attention`: cuDNN where it applies,
  else XLA's composition) or 'reference' (float32 scores materialised).
  """
  if implementation == "fused":
    return fused.fused_attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD,
                                 key_valid_BxS, scale=scale)
  if implementation != "reference":
    raise ValueError(f"implementation must be 'fused' or 'reference', got "
                     f"{implementation!r}")
  return reference.masked_attention(q_BxQxHxD, k_BxSxKxD, v_BxSxKxD,
                                    key_valid_BxS, scale=scale)


def scheduled_attention(q_BxQxHxD: jax.Array, k_cache_BxSxKxD: jax.Array,
                        v_cache_BxSxKxD: jax.Array, k_len_B: jax.Array,
                        q_len_B: jax.Array, *, scale: float,
                        k_new_BxIxKxD=None, v_new_BxIxKxD=None,
                        inq_mask_BxQxI=None, exclude_BxS=None,
                        exclude_BxX=None, score_rows_BxQ=None,
                        head_mass: bool = False,
                        score_prefix: int | None = None,
                        score: str = "mass",
                        implementation: str | None = None,
                        k_scale_BxSxK=None, v_scale_BxSxK=None,
                        kv_repeat: int = 1, **kernel_options):
  """Ragged GQA attention over cache[:k_len] minus exclusions plus new keys.

  Returns (o_BxQxHxD, mass_BxS or None); see reference.scheduled_attention
  (head_mass: mass_BxKxS per KV head, to be summed by `sum_heads`;
  score_prefix: only the first score_prefix queries can be score rows;
  score: "mass" or "logit", what is summed per key).
  Exclusions: boolean exclude_BxS (what the kernel reads), or a padded
  position list exclude_BxX (-1 = none), turned into the mask here.
  implementation: 'pallas', 'pallas_interpret', 'mosaic', 'mosaic_interpret',
  'reference', or None (pallas on GPU, reference elsewhere). 'mosaic' is the
  Mosaic GPU (Hopper) kernel (mosaic.py) for bf16 caches without in-query
  keys; what it does not take runs 'pallas' ('mosaic_interpret':
  'pallas_interpret'), and what that does not take the reference.
  kernel_options: block_r, block_k, split_tiles (see `split_tiles_for`) or
  num_splits, split_group (key splits a program runs; no bit depends on
  it), num_warps, num_stages, and tiling (a Tiling: the rules the defaults
  follow), passed to the kernel that runs.
  k_scale_BxSxK, v_scale_BxSxK: the per-slot scales of an 8-bit cache
  (float8_e4m3fn or int8 K/V, kv_quant.py), both or neither; the kernels
  dequantize per tile, the reference dequantizes first. The Mosaic kernel
  takes no 8-bit cache ('pallas' runs it). Left padding of the keys by a
  multiple of PAD_ALIGN excluded slots leaves the kernel's results unchanged.
  kv_repeat: the cache (K/V, scales, exclusions) has one row per kv_repeat
  consecutive query sequences, which share it (the Triton kernel reads it
  in place; the reference repeats it; the Mosaic kernel runs 'pallas').
  """
  impl = resolve_implementation(implementation, IMPLEMENTATIONS)
  if exclude_BxX is not None:
    ex = exclude_mask_from_positions(exclude_BxX, k_cache_BxSxKxD.shape[1])
    exclude_BxS = ex if exclude_BxS is None else exclude_BxS | ex
  args = (q_BxQxHxD, k_cache_BxSxKxD, v_cache_BxSxKxD, k_len_B, q_len_B)
  kw = dict(scale=scale, k_new_BxIxKxD=k_new_BxIxKxD,
            v_new_BxIxKxD=v_new_BxIxKxD, inq_mask_BxQxI=inq_mask_BxQxI,
            exclude_BxS=exclude_BxS, score_rows_BxQ=score_rows_BxQ,
            head_mass=head_mass, score_prefix=score_prefix)
  if score not in ("mass", "logit"):
    raise ValueError(f"score must be 'mass' or 'logit', got {score!r}")
  kw["score"] = score
  if (k_scale_BxSxK is None) != (v_scale_BxSxK is None):
    raise ValueError("pass both k_scale_BxSxK and v_scale_BxSxK, or neither")
  if k_scale_BxSxK is not None:
    for name, x in (("k", k_cache_BxSxKxD), ("v", v_cache_BxSxKxD)):
      if not kv_quant.is_quantized(x.dtype):
        raise ValueError(f"scales given for a {x.dtype} {name} cache; an "
                         f"8-bit cache is one of {sorted(kv_quant.FORMAT_MAX)}")
    kw.update(k_scale_BxSxK=k_scale_BxSxK, v_scale_BxSxK=v_scale_BxSxK)
    if impl in ("mosaic", "mosaic_interpret"):
      impl = "pallas" if impl == "mosaic" else "pallas_interpret"
  elif kv_quant.is_quantized(k_cache_BxSxKxD.dtype):
    raise ValueError(f"an 8-bit ({k_cache_BxSxKxD.dtype}) cache needs its "
                     "k_scale_BxSxK and v_scale_BxSxK")
  if kv_repeat != 1:
    if impl in ("mosaic", "mosaic_interpret"):
      impl = "pallas" if impl == "mosaic" else "pallas_interpret"
    kernel_options["kv_repeat"] = kv_repeat
  if impl in ("mosaic", "mosaic_interpret"):
    # Imported here: Mosaic GPU's Python modules cost ~0.3 s to import.
    from pallas_kernels.attention import mosaic
    try:
      return mosaic.scheduled_attention(
          *args, **kw, interpret=impl == "mosaic_interpret", **kernel_options)
    except NotImplementedError:
      impl = "pallas" if impl == "mosaic" else "pallas_interpret"
  if impl != "reference":
    try:
      return kernel.scheduled_attention(
          *args, **kw, interpret=impl == "pallas_interpret",
          **kernel_options)
    except NotImplementedError:
      pass
  if kv_repeat != 1:
    rep = lambda x: jnp.repeat(x, kv_repeat, axis=0)
    args = (q_BxQxHxD, rep(k_cache_BxSxKxD), rep(v_cache_BxSxKxD), k_len_B,
            q_len_B)
    for name in ("exclude_BxS", "k_scale_BxSxK", "v_scale_BxSxK"):
      if kw.get(name) is not None:
        kw[name] = rep(kw[name])
  return reference.scheduled_attention(*args, **kw)
