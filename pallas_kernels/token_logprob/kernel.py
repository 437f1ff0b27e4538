"""Pallas (Triton) token log-probabilities whose bits depend on the row alone.

Grid: one program per `block_n` rows. Each program streams its rows' logits
in `block_v`-wide tiles, in order, with an online max and sum of exp (as a
flash-attention row), and picks the token's logit from the tile that holds
it. The tile sizes and warp count are constants, never functions of N, so a
row's sum runs the same adds whatever else is in the call: a row's
confidence, and so which tokens a sampler commits, cannot depend on the
batch (XLA's own reduction chose its order by shape).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG = -1e30  # finite: exp(NEG - NEG) on padding rows never makes a NaN
BLOCK_N, BLOCK_V, NUM_WARPS = 8, 1024, 4


def _kernel(logits_ref, tok_ref, out_ref, *, n, v, block_n, block_v):
  first = pl.program_id(0) * block_n
  rows = pl.ds(first, block_n)
  row_ok = first + jnp.arange(block_n) < n
  tok = plgpu.load(tok_ref.at[rows], mask=row_ok, other=0)

  def tile(t, carry):
    m, l, hit = carry
    cols = t * block_v + jnp.arange(block_v)
    ok = row_ok[:, None] & (cols < v)[None, :]
    x = plgpu.load(logits_ref.at[rows, pl.ds(t * block_v, block_v)],
                   mask=ok, other=0).astype(jnp.float32)
    x = jnp.where(ok, x, NEG)
    m_new = jnp.maximum(m, jnp.max(x, axis=1))
    l = l * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new[:, None]), axis=1)
    hit = hit + jnp.sum(jnp.where(cols[None, :] == tok[:, None], x, 0.0),
                        axis=1)  # one nonzero term: exact
    return m_new, l, hit

  init = (jnp.full((block_n,), NEG, jnp.float32),
          jnp.zeros((block_n,), jnp.float32), jnp.zeros((block_n,), jnp.float32))
  m, l, hit = lax.fori_loop(0, pl.cdiv(v, block_v), tile, init)
  plgpu.store(out_ref.at[rows], (hit - m) - jnp.log(l), mask=row_ok)


@functools.partial(jax.jit, static_argnames=("interpret",))
def token_logprob(logits_NxV: jax.Array, tokens_N: jax.Array, *,
                  interpret: bool = False) -> jax.Array:
  """Same contract as reference.token_logprob; the float32 result differs
  from it by rounding only ((x - max) - log(sum) in both, summed in another
  order)."""
  n, v = logits_NxV.shape
  if tokens_N.shape != (n,):
    raise ValueError(f"tokens {tokens_N.shape} must be [N] = ({n},)")
  kern = functools.partial(_kernel, n=n, v=v, block_n=BLOCK_N,
                           block_v=BLOCK_V)
  return pl.pallas_call(
      kern, grid=(pl.cdiv(n, BLOCK_N),),
      out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
      compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=3),
      interpret=interpret)(logits_NxV, tokens_N.astype(jnp.int32))
