"""The problems the scheduled-attention kernel tests share: random inputs
with NaN-poisoned dead slots and padded query rows, the check of a result
against the reference, and the shape cases."""

import jax.numpy as jnp
import numpy as np

from pallas_kernels.attention import reference
from tests.kernel_case import assert_close, compiled, normal, on_device

# The mass against the reference's: a sum of probabilities over heads.
MASS_TOL = {jnp.float32: dict(rtol=1e-4, atol=1e-4),
            jnp.bfloat16: dict(rtol=1e-4, atol=1e-2)}


def inputs(rng, b, q, h, kh, d, s, t, k_lens, q_lens, dtype, excl=True,
           score=True, t_frac=0.6):
  """Random problem from the numpy generator `rng` (kernel_case.rng);
  returns (args, kwargs) for scheduled_attention."""
  k_len_B = np.array(k_lens, np.int32)
  q_len_B = np.array(q_lens, np.int32)
  pad_BxQ = np.arange(q)[None, :] >= q_len_B[:, None]
  q_BxQxHxD = rng.standard_normal((b, q, h, d))
  q_BxQxHxD[pad_BxQ] = np.nan
  exclude_BxS = rng.random((b, s)) < 0.2 if excl else None
  dead_BxS = np.arange(s)[None, :] >= k_len_B[:, None]
  if excl:
    dead_BxS |= exclude_BxS

  def poisoned():
    x = rng.standard_normal((b, s, kh, d))
    x[dead_BxS] = np.nan
    return on_device(x, dtype)

  kw = dict(scale=d ** -0.5, exclude_BxS=None if exclude_BxS is None
            else jnp.asarray(exclude_BxS))
  if t:
    kw.update(k_new_BxIxKxD=normal(rng, (b, t, kh, d), dtype),
              v_new_BxIxKxD=normal(rng, (b, t, kh, d), dtype),
              inq_mask_BxQxI=jnp.asarray(rng.random((b, q, t)) < t_frac))
  if score:
    kw["score_rows_BxQ"] = jnp.asarray(rng.random((b, q)) < 0.6)
  args = (on_device(q_BxQxHxD, dtype), poisoned(), poisoned(), jnp.asarray(k_len_B),
          jnp.asarray(q_len_B))
  return args, kw


# The reference as one program a shape (kernel_case.compiled).
reference_attention = compiled(reference.scheduled_attention)


def check(args, kw, got, dtype):
  want_o, want_m = reference_attention(*args, **kw)
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


# (B, Q, H, K, D, S, T, k_lens, q_lens, block_k, split_tiles): split_tiles
# at least cdiv(S, block_k) is one split; g7_d128_split's first of its 3
# splits is empty at k_len 101.
CASES = {
    "g1_d64": (2, 5, 2, 2, 64, 70, 0, [70, 33], [5, 3], 16, 5),
    "g4_d128_new": (2, 8, 8, 2, 128, 100, 12, [0, 77], [8, 6], 32, 4),
    "g7_d64_new": (2, 6, 7, 1, 64, 130, 20, [129, 17], [6, 0], 32, 5),
    "g7_d128_split": (1, 9, 7, 1, 128, 150, 9, [101], [9], 16, 4),
    "g4_d64_split": (3, 4, 4, 1, 64, 40, 4, [40, 0, 23], [4, 2, 1], 16, 1),
    "g1_d128_long": (1, 16, 4, 4, 128, 300, 32, [257], [13], 64, 3),
}
