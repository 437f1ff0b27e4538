"""Public entry: fused RoPE + KV-cache write, kernel or reference."""

import jax

from pallas_kernels.cache_update import kernel, reference
from pallas_kernels.common import resolve_implementation

IMPLEMENTATIONS = ("pallas", "pallas_interpret", "mosaic", "mosaic_interpret",
                   "reference")


def rope_write(q_BxQxHxD: jax.Array, k_BxQxKxD: jax.Array,
               v_BxQxKxD: jax.Array, positions_BxQ: jax.Array,
               slots_BxQ: jax.Array, k_cache_BxSxKxD: jax.Array,
               v_cache_BxSxKxD: jax.Array, *, theta: float,
               scale: float = 1.0, implementation: str | None = None):
  """Returns (rope(q) * scale, k_cache with rope(k) written, v_cache with v).

  implementation: 'pallas', 'pallas_interpret', 'reference', or None (pallas
  on GPU, reference elsewhere). Shapes the kernel can't tile fall back to the
  reference. Donate the caches (jit donate_argnums) for an in-place write.
  'mosaic' / 'mosaic_interpret': the Mosaic GPU (Hopper, TMA) kernel
  (mosaic.py), in Mosaic GPU's interpret mode for the latter; what it does
  not take falls through to 'pallas' / 'pallas_interpret', then the
  reference. Never the default.
  """
  impl = resolve_implementation(implementation, IMPLEMENTATIONS)
  args = (q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
          k_cache_BxSxKxD, v_cache_BxSxKxD)
  if impl in ("mosaic", "mosaic_interpret"):
    # Imported here: Mosaic GPU's Python modules cost ~0.3 s to import.
    from pallas_kernels.cache_update import mosaic
    interpret = impl == "mosaic_interpret"
    try:
      return mosaic.rope_write(*args, theta=theta, scale=scale,
                               interpret=interpret)
    except NotImplementedError:
      pass
    impl = "pallas_interpret" if interpret else "pallas"
  if impl != "reference":
    try:
      return kernel.rope_write(*args, theta=theta, scale=scale,
                               interpret=impl == "pallas_interpret")
    except NotImplementedError:
      pass
  return reference.rope_write(*args, theta=theta, scale=scale)
