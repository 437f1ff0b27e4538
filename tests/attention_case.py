"""The problems the scheduled-attention kernel tests share: random inputs
with NaN-poisoned dead slots and padded query rows, the check of a result
against the reference, and the shape cases."""

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.attention import reference
from tests.kernel_case import assert_close

# The mass against the reference's: a sum of probabilities over heads.
MASS_TOL = {jnp.float32: dict(rtol=1e-4, atol=1e-4),
            jnp.bfloat16: dict(rtol=1e-4, atol=1e-2)}


def inputs(key, b, q, h, kh, d, s, t, k_lens, q_lens, dtype, excl=True,
           score=True, t_frac=0.6):
  """Random problem; returns (args, kwargs) for scheduled_attention."""
  ks = jax.random.split(key, 9)
  rnd = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(dtype)
  k_len_B = jnp.array(k_lens, jnp.int32)
  q_len_B = jnp.array(q_lens, jnp.int32)
  q_BxQxHxD = rnd(ks[0], (b, q, h, d))
  pad_BxQ = jnp.arange(q)[None, :] >= q_len_B[:, None]
  q_BxQxHxD = jnp.where(pad_BxQ[..., None, None], jnp.nan, q_BxQxHxD)
  exclude_BxS = (jax.random.bernoulli(ks[1], 0.2, (b, s)) if excl else None)
  dead_BxS = jnp.arange(s)[None, :] >= k_len_B[:, None]
  if excl:
    dead_BxS |= exclude_BxS
  poison = lambda x: jnp.where(dead_BxS[..., None, None], jnp.nan, x)
  kw = dict(scale=d ** -0.5, exclude_BxS=exclude_BxS)
  if t:
    kw.update(k_new_BxIxKxD=rnd(ks[2], (b, t, kh, d)),
              v_new_BxIxKxD=rnd(ks[3], (b, t, kh, d)),
              inq_mask_BxQxI=jax.random.bernoulli(ks[4], t_frac, (b, q, t)))
  if score:
    kw["score_rows_BxQ"] = jax.random.bernoulli(ks[5], 0.6, (b, q))
  args = (q_BxQxHxD, poison(rnd(ks[6], (b, s, kh, d))),
          poison(rnd(ks[7], (b, s, kh, d))), k_len_B, q_len_B)
  return args, kw


def check(args, kw, got, dtype):
  want_o, want_m = reference.scheduled_attention(*args, **kw)
  o = np.asarray(got[0], np.float32)
  assert np.isfinite(o).all(), "NaN/inf in attention output"
  assert_close(o, want_o, dtype)
  pad = np.arange(o.shape[1])[None, :] >= np.asarray(args[4])[:, None]
  assert (o[pad] == 0).all(), "padded query rows must be zero"
  if "score_rows_BxQ" not in kw:
    assert got[1] is None
    return
  mass = np.asarray(got[1])
  assert np.isfinite(mass).all()
  assert_close(mass, want_m, dtype, table=MASS_TOL)
  dead = np.arange(mass.shape[1])[None, :] >= np.asarray(args[3])[:, None]
  assert (mass[dead] == 0).all()


# (B, Q, H, K, D, S, T, k_lens, q_lens, block_k, splits)
CASES = {
    "g1_d64": (2, 5, 2, 2, 64, 70, 0, [70, 33], [5, 3], 16, 1),
    "g4_d128_new": (2, 8, 8, 2, 128, 100, 12, [0, 77], [8, 6], 32, 1),
    "g7_d64_new": (2, 6, 7, 1, 64, 130, 20, [129, 17], [6, 0], 32, 1),
    "g7_d128_split": (1, 9, 7, 1, 128, 150, 9, [101], [9], 16, 3),
    "g4_d64_split": (3, 4, 4, 1, 64, 40, 4, [40, 0, 23], [4, 2, 1], 16, 4),
    "g1_d128_long": (1, 16, 4, 4, 128, 300, 32, [257], [13], 64, 2),
}
