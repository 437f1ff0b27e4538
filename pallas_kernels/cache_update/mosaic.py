"""Pallas Mosaic GPU (Hopper) fused RoPE + in-place KV-cache write.

The same contract as kernel.py (Triton): rotate the H query heads and K key
heads of each fresh token in float32 (split halves, angle position *
inv_freq), scale q, and store the rotated key and the value row into cache
row `slots_BxQ[b, i]` (-1 = skip). The caches [B, S, K, D] are aliased input
-> output, so under `jax.jit(..., donate_argnums=...)` only the Q written
rows move and the other S - Q rows are never read. The aliasing goes through
jax Refs handed to pl.kernel (it aliases every Ref operand): plgpu.kernel's
custom_vmap takes no Refs, and a pallas_call grid (input_output_aliases)
reads program_id, which Mosaic GPU's interpreter gives as 0 everywhere; the
mesh's named axes (lax.axis_index) are right in both.

One program (a warpgroup, 128 threads) per (sequence b, token i): TMA copies
q [H, D], k [K, D], v [K, D] and a [C, D/2] inv_freq table into shared
memory, the halves are rotated in place C heads at a time ([C, D/2] is 256
elements, which makes bf16 and float32 take the same strided register
layout; H and K are padded up to C in shared memory only), and TMA writes
q's rows to the output and, when the slot is in [0, S), k's and v's rows to
the caches (v goes shared memory -> cache untouched). cos/sin are computed
once a program, never materialised in HBM; inv_freq is reference's host
constant, so the angle's bits match the reference's.

interpret=True runs the kernel in Mosaic GPU's interpret mode on the CPU
(InterpretGPUParams: private as of jax 0.11; see mosaic_gpu.py).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.cache_update import reference
from pallas_kernels.mosaic_gpu import (SEMANTICS, interpret_params,
                                       reset_interpret_state)

__all__ = ["rope_write", "reset_interpret_state"]

# Lane semantics (mosaic_gpu.SEMANTICS): registers take the strided layout
# of each [C, D/2] chunk.
# Elements of one rotated chunk: 128 threads x 2, one layout for bf16 and f32
# (a strided load picks min(8 bytes, elements / 128) a thread).
CHUNK = 256
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _rotate_rows(x_smem, cos, sin, scale, c, half):
  """Rotates x_smem [N', D] in place, c rows (heads) at a time, in float32
  (cos, sin [c, D/2]); times scale."""
  for h0 in range(0, x_smem.shape[0], c):
    lo = x_smem.at[pl.ds(h0, c), pl.ds(0, half)]
    hi = x_smem.at[pl.ds(h0, c), pl.ds(half, half)]
    x1, x2 = lo[...].astype(jnp.float32), hi[...].astype(jnp.float32)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if scale != 1.0:
      o1, o2 = o1 * scale, o2 * scale
    lo[...] = o1.astype(x_smem.dtype)
    hi[...] = o2.astype(x_smem.dtype)


def _kernel(pos_gmem, slot_gmem, invf_gmem, q_gmem, k_gmem, v_gmem, kc_gmem,
            vc_gmem, qo_gmem, *, scale, h, kh, s, c):
  """Refs: GMEM operands whole ([B, Q, ...]; the caches [B, S, K, D] are
  jax Refs, so pl.kernel aliases them in -> out)."""
  d = q_gmem.shape[-1]
  pad = lambda n: math.ceil(n / c) * c
  # Scratch through run_scoped, as plgpu.kernel does (the interpreter takes
  # no barriers among a kernel's scratch_types).
  pl.run_scoped(
      functools.partial(_program, pos_gmem, slot_gmem, invf_gmem, q_gmem,
                        k_gmem, v_gmem, qo_gmem, kc_gmem, vc_gmem,
                        scale=scale, h=h, kh=kh, s=s, c=c),
      plgpu.SMEM((c, d // 2), jnp.float32),
      plgpu.SMEM((pad(h), d), q_gmem.dtype),
      plgpu.SMEM((pad(kh), d), k_gmem.dtype),
      plgpu.SMEM((kh, d), v_gmem.dtype),
      plgpu.Barrier(num_barriers=4))


def _program(pos_gmem, slot_gmem, invf_gmem, q_gmem, k_gmem, v_gmem, qo_gmem,
             kc_gmem, vc_gmem, invf_smem, q_smem, k_smem, v_smem, bars, *,
             scale, h, kh, s, c):
  """One token: SMEM q_smem [H', D], k_smem [K', D] (H', K' padded to c),
  v_smem [K, D], invf_smem [c, D/2]; four TMA barriers."""
  # Named mesh axes: the GPU interpreter reads every program_id as 0.
  b, i = lax.axis_index("b"), lax.axis_index("i")
  half = q_smem.shape[-1] // 2
  plgpu.copy_gmem_to_smem(invf_gmem, invf_smem, bars.at[0])
  plgpu.copy_gmem_to_smem(q_gmem.at[b, i], q_smem.at[pl.ds(0, h)], bars.at[1])
  plgpu.copy_gmem_to_smem(k_gmem.at[b, i], k_smem.at[pl.ds(0, kh)],
                          bars.at[2])
  plgpu.copy_gmem_to_smem(v_gmem.at[b, i], v_smem, bars.at[3])
  pos, slot = pos_gmem[b, i], slot_gmem[b, i]
  plgpu.barrier_wait(bars.at[0])
  angle = pos.astype(jnp.float32) * invf_smem[...]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  plgpu.barrier_wait(bars.at[1])
  _rotate_rows(q_smem, cos, sin, scale, c, half)
  plgpu.commit_smem()  # register stores -> visible to TMA
  plgpu.copy_smem_to_gmem(q_smem.at[pl.ds(0, h)], qo_gmem.at[b, i])
  plgpu.barrier_wait(bars.at[2])
  _rotate_rows(k_smem, cos, sin, 1.0, c, half)
  plgpu.commit_smem()
  plgpu.barrier_wait(bars.at[3])

  @pl.when((slot >= 0) & (slot < s))
  def _write():
    plgpu.copy_smem_to_gmem(k_smem.at[pl.ds(0, kh)], kc_gmem.at[b, slot])
    plgpu.copy_smem_to_gmem(v_smem, vc_gmem.at[b, slot])

  plgpu.wait_smem_to_gmem(0)


def _check(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, k_cache_BxSxKxD, v_cache_BxSxKxD):
  """NotImplementedError for what this kernel does not take."""
  b, q, h, d = q_BxQxHxD.shape
  kh = k_cache_BxSxKxD.shape[2]
  if d % 2 or CHUNK % (d // 2) or d * q_BxQxHxD.dtype.itemsize % 16:
    raise NotImplementedError(f"head_dim {d}: D/2 must divide {CHUNK} and "
                              "a row be a multiple of 16 bytes (TMA)")
  if k_BxQxKxD.shape != (b, q, kh, d) or v_BxQxKxD.shape != (b, q, kh, d):
    raise NotImplementedError("k/v must be [B, Q, K, D] matching the cache")
  if v_cache_BxSxKxD.shape != k_cache_BxSxKxD.shape:
    raise NotImplementedError("k and v caches must have the same shape")
  if max(h, kh, d) > 256:
    raise NotImplementedError(f"{max(h, kh)} heads, head_dim {d}: a TMA box "
                              "holds 256 a dim")
  if max(b, q) > 65535:
    raise NotImplementedError(f"grid ({b}, {q}): CUDA takes 65535 a dim")
  for name, x in (("q", q_BxQxHxD), ("k", k_BxQxKxD), ("v", v_BxQxKxD)):
    if x.dtype not in DTYPES:
      raise NotImplementedError(f"{name} dtype {x.dtype}: floats only")
  if (k_BxQxKxD.dtype != k_cache_BxSxKxD.dtype
      or v_BxQxKxD.dtype != v_cache_BxSxKxD.dtype):
    raise NotImplementedError("k / v dtype must match its cache's (rows are "
                              "rotated in place and copied as they are)")


def _table(d, theta, c):
  """inv_freq [D/2] repeated over c rows: [c, D/2] float32, host constant."""
  return np.tile(reference.rope_inv_freq(d, theta), (c, 1))


@functools.partial(jax.jit, static_argnames=("theta", "scale", "interpret"))
def rope_write(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, positions_BxQ, slots_BxQ,
               k_cache_BxSxKxD, v_cache_BxSxKxD, *, theta: float,
               scale: float = 1.0, interpret: bool = False):
  """Same contract as reference.rope_write; caches are updated in place.

  Takes float q/k/v with k and v in their caches' dtypes, D/2 dividing 256
  (D = 32, 64, 128, 256), at most 256 heads, any H and K (GQA, K = 1);
  raises NotImplementedError for anything else.
  """
  _check(q_BxQxHxD, k_BxQxKxD, v_BxQxKxD, k_cache_BxSxKxD, v_cache_BxSxKxD)
  b, q, h, d = q_BxQxHxD.shape
  s, kh = k_cache_BxSxKxD.shape[1], k_cache_BxSxKxD.shape[2]
  c = CHUNK // (d // 2)
  kernel = functools.partial(_kernel, scale=float(scale), h=h, kh=kh, s=s,
                             c=c)
  # Refs: pl.kernel aliases them input -> output (see the module docstring).
  k_ref = jax.new_ref(k_cache_BxSxKxD, memory_space=plgpu.GMEM)
  v_ref = jax.new_ref(v_cache_BxSxKxD, memory_space=plgpu.GMEM)
  q_out = pl.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct(q_BxQxHxD.shape, q_BxQxHxD.dtype),
      mesh=plgpu.Mesh(grid=(b, q), grid_names=("b", "i")),
      compiler_params=plgpu.CompilerParams(lowering_semantics=SEMANTICS),
      interpret=interpret_params() if interpret else False,
      name="rope_cache_write_mosaic",
  )(positions_BxQ.astype(jnp.int32), slots_BxQ.astype(jnp.int32),
    jnp.asarray(_table(d, theta, c)), q_BxQxHxD, k_BxQxKxD, v_BxQxKxD,
    k_ref, v_ref)
  return q_out, jax.freeze(k_ref), jax.freeze(v_ref)
