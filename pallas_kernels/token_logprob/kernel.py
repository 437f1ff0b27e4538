"""Pallas (Triton) token log-probabilities whose bits depend on the row alone.

Grid: (row block of `block_n` rows, vocabulary chunk of CHUNK_V logits).
Each program streams its rows' chunk in `block_v`-wide tiles, in order, with
an online max and sum of exp (as a flash-attention row), and picks the
token's logit from the tile that holds it; the chunks' (max, sum, logit)
are then merged in chunk order. Splitting the vocabulary lets a call of few
rows (a batch-1 decode step: 16 rows x 126,464 logits) fill the GPU rather
than run 2 programs down the whole vocabulary. The tile and chunk sizes and
the warp count are constants, never functions of N, so a row's sum runs the
same adds whatever else is in the call: a row's confidence, and so which
tokens a sampler commits, cannot depend on the batch (XLA's own reduction
chose its order by shape).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG = -1e30  # finite: exp(NEG - NEG) on padding rows never makes a NaN
BLOCK_N, BLOCK_V, NUM_WARPS = 8, 1024, 4
CHUNK_V = 16 * BLOCK_V


def _kernel(logits_ref, tok_ref, m_ref, l_ref, hit_ref, *, n, v, block_n,
            block_v, chunk_tiles):
  first = pl.program_id(0) * block_n
  rows = pl.ds(first, block_n)
  row_ok = first + jnp.arange(block_n) < n
  tok = plgpu.load(tok_ref.at[rows], mask=row_ok, other=0)
  t0 = pl.program_id(1) * chunk_tiles
  t1 = jnp.minimum(t0 + chunk_tiles, pl.cdiv(v, block_v))

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
  m, l, hit = lax.fori_loop(t0, t1, tile, init)
  for ref, value in ((m_ref, m), (l_ref, l), (hit_ref, hit)):
    plgpu.store(ref.at[rows], value, mask=row_ok)


@functools.partial(jax.jit, static_argnames=("interpret",))
def token_logprob(logits_NxV: jax.Array, tokens_N: jax.Array, *,
                  interpret: bool = False) -> jax.Array:
  """Same contract as reference.token_logprob; the float32 result differs
  from it by rounding only ((x - max) - log(sum) in both, summed in another
  order)."""
  n, v = logits_NxV.shape
  if tokens_N.shape != (n,):
    raise ValueError(f"tokens {tokens_N.shape} must be [N] = ({n},)")
  chunks = pl.cdiv(v, CHUNK_V)
  kern = functools.partial(_kernel, n=n, v=v, block_n=BLOCK_N,
                           block_v=BLOCK_V, chunk_tiles=CHUNK_V // BLOCK_V)
  part = jax.ShapeDtypeStruct((chunks, n), jnp.float32)
  spec = pl.BlockSpec((None, n), lambda i, c: (c, 0))
  full = lambda a: pl.BlockSpec(a.shape, lambda i, c: (0,) * a.ndim)
  tokens_N = tokens_N.astype(jnp.int32)
  m_chunks, l_chunks, hit_chunks = pl.pallas_call(
      kern, grid=(pl.cdiv(n, BLOCK_N), chunks),
      in_specs=[full(logits_NxV), full(tokens_N)],
      out_specs=[spec] * 3, out_shape=[part] * 3,
      compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=3),
      interpret=interpret, name="token_logprob")(logits_NxV, tokens_N)
  return _merge(m_chunks, l_chunks, hit_chunks)


def _merge(m_chunks, l_chunks, hit_chunks):
  """log p from the chunks' partials, added in chunk order (an unrolled
  chain, not an XLA reduction whose order could follow the shape)."""
  m_N = m_chunks[0]
  for c in range(1, m_chunks.shape[0]):
    m_N = jnp.maximum(m_N, m_chunks[c])
  l_N = l_chunks[0] * jnp.exp(m_chunks[0] - m_N)
  hit_N = hit_chunks[0]
  for c in range(1, m_chunks.shape[0]):
    l_N = l_N + l_chunks[c] * jnp.exp(m_chunks[c] - m_N)
    hit_N = hit_N + hit_chunks[c]  # one chunk holds the token: exact
  return (hit_N - m_N) - jnp.log(l_N)
