"""Scheduled attention is blind to left padding of the keys by multiples of
PAD_ALIGN: a row laid out with extra excluded slots in front of its cache
(k_len grown by as much) gives the same output and mass, bit for bit, as
the row alone, whatever the key splits (tiling.split_range). Pad slots hold
NaN or garbage: the kernel must never read them unmasked.

CPU runs the kernel in Pallas interpret mode.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, kernel
from pallas_kernels.attention.tiling import PAD_ALIGN, Tiling, split_count
from tests.kernel_case import rng as _rng

H, KH, D, T = 4, 2, 16, 5


def _row(rng, q, s, t):
  """One problem of B=2 sequences with k_len = s (numpy, float64)."""
  p = dict(q=rng.standard_normal((2, q, H, D)),
           k=rng.standard_normal((2, s, KH, D)),
           v=rng.standard_normal((2, s, KH, D)),
           ex=rng.random((2, s)) < 0.2, q_len=np.array([q, q - 1]),
           score=rng.random((2, q)) < 0.6)
  p["score"][:, 0] = True
  if t:
    p.update(k_new=rng.standard_normal((2, t, KH, D)),
             v_new=rng.standard_normal((2, t, KH, D)),
             inq=rng.random((2, q, t)) < 0.5)
  return p


def _padded(p, pad, fill):
  """p with `pad` excluded slots holding `fill` in front of the cache."""
  front = lambda x: np.concatenate(
      [np.full(x.shape[:1] + (pad,) + x.shape[2:], fill), x], axis=1)
  return dict(p, k=front(p["k"]), v=front(p["v"]),
              ex=np.concatenate([np.ones((2, pad), bool), p["ex"]], axis=1))


def _run(p, dtype, **kw):
  s = p["k"].shape[1]
  new = {} if "k_new" not in p else dict(
      k_new_BxIxKxD=jnp.asarray(p["k_new"], dtype),
      v_new_BxIxKxD=jnp.asarray(p["v_new"], dtype),
      inq_mask_BxQxI=jnp.asarray(p["inq"]))
  o, mass = api.scheduled_attention(
      jnp.asarray(p["q"], dtype), jnp.asarray(p["k"], dtype),
      jnp.asarray(p["v"], dtype), jnp.full((2,), s, jnp.int32),
      jnp.asarray(p["q_len"], jnp.int32), scale=D ** -0.5,
      exclude_BxS=jnp.asarray(p["ex"]), score_rows_BxQ=jnp.asarray(p["score"]),
      implementation="pallas_interpret", **new, **kw)
  return np.asarray(o, np.float32), np.asarray(mass)


# (S, block_k, split_tiles, tiling, pads): splits of the unpadded layout.
LAYOUTS = {
    "several_splits": (100, 16, 3, Tiling(), (64, 128)),       # 3 -> 4, 5
    "one_then_two": (100, 16, 7, Tiling(), (64, 192)),         # 1 -> 2, 3
    "default_rule": (150, 16, None, Tiling(), (64,)),           # 3 -> 4
    "never_split": (100, 16, None, Tiling(split_target=1), (64,)),  # 1 -> 1
    "block_k_32": (150, 32, 2, Tiling(), (64,)),               # 3 -> 4
    "block_k_64": (130, 64, 1, Tiling(), (128,)),              # 3 -> 5
}

# (layout, dtype, in-query keys, score, score_prefix, head_mass)
CASES = [
    ("several_splits", jnp.float32, True, "mass", None, False),
    ("several_splits", jnp.bfloat16, True, "logit", 2, True),
    ("one_then_two", jnp.float32, True, "logit", None, True),
    ("one_then_two", jnp.bfloat16, False, "mass", 2, False),
    ("default_rule", jnp.bfloat16, True, "mass", None, True),
    ("never_split", jnp.float32, True, "mass", 2, False),
    ("block_k_32", jnp.float32, False, "logit", 2, False),
    ("block_k_64", jnp.bfloat16, True, "mass", None, False),
]


@pytest.mark.parametrize(
    "layout,dtype,t,score,prefix,head_mass",
    [pytest.param(*c, id=f"{c[0]}-{np.dtype(c[1]).name}-new{int(c[2])}-"
                  f"{c[3]}-p{c[4]}-h{int(c[5])}") for c in CASES])
def test_left_padding_keeps_the_bits(request, layout, dtype, t, score, prefix,
                                     head_mass):
  s, block_k, split_tiles, tiling, pads = LAYOUTS[layout]
  p = _row(_rng(request), 4, s, T if t else 0)
  kw = dict(block_k=block_k, split_tiles=split_tiles, tiling=tiling,
            score=score, score_prefix=prefix, head_mass=head_mass)
  want_o, want_m = _run(p, dtype, **kw)
  assert np.isfinite(want_o).all() and np.isfinite(want_m).all()
  assert (want_o != 0).any() and (want_m != 0).any()
  for pad, fill in zip(pads, (np.nan, 1e4)):
    got_o, got_m = _run(_padded(p, pad, fill), dtype, **kw)
    np.testing.assert_array_equal(got_o, want_o, f"o, pad {pad}")
    np.testing.assert_array_equal(got_m[..., pad:], want_m, f"mass, pad {pad}")
    assert (got_m[..., :pad] == 0).all()


def test_layouts_cover_split_counts():
  """The layouts above do change the number of key splits with the pad."""
  def splits(s, block_k, split_tiles, tiling):
    st = split_tiles or api.split_tiles_for((2, 4, H, D), (2, s, KH, D),
                                            block_k=block_k, tiling=tiling)
    return split_count(s, block_k, st)
  for name, want in [("several_splits", (3, 4, 5)), ("one_then_two", (1, 2, 3)),
                     ("default_rule", (3, 4)), ("never_split", (1, 1)),
                     ("block_k_64", (3, 5))]:
    s, block_k, split_tiles, tiling, pads = LAYOUTS[name]
    got = tuple(splits(s + pad, block_k, split_tiles, tiling)
                for pad in (0, *pads))
    assert got == want, name


def test_rows_of_different_lengths_in_one_padded_pool(request):
  """The server's pool: rows of other lengths left-padded to one length
  give each row's bits of its own layout (default tiling, bf16)."""
  rng = _rng(request)
  short, long = _row(rng, 4, 36, T), _row(rng, 4, 100, T)
  kw = dict(block_k=16, tiling=Tiling(split_tiles=2), score="mass")
  pool = {k: np.concatenate([_padded(short, 128, 0.0)[k][:1],
                             _padded(long, 64, 0.0)[k][1:]])
          for k in short}
  got_o, got_m = _run(pool, jnp.bfloat16, **kw)
  for i, (row, pad) in enumerate(((short, 128), (long, 64))):
    want_o, want_m = _run(row, jnp.bfloat16, **kw)
    np.testing.assert_array_equal(got_o[i], want_o[i])
    np.testing.assert_array_equal(got_m[i, pad:], want_m[i])
    assert (got_m[i, :pad] == 0).all()


@pytest.mark.parametrize("block_k", [128, 48, 8])
def test_a_block_k_not_dividing_pad_align_is_refused(request, block_k):
  p = _row(_rng(request), 4, 40, 0)
  with pytest.raises(ValueError, match=f"dividing PAD_ALIGN={PAD_ALIGN}"):
    _run(p, jnp.float32, block_k=block_k)
  with pytest.raises(ValueError, match="block_k must be"):
    Tiling(block_k=block_k)
  with pytest.raises(ValueError, match="split_tiles must be"):
    Tiling(split_tiles=0)


def test_num_splits_is_an_override_of_the_split_size(request):
  """num_splits (benchmark sweeps) sets split_tiles from S; not with both."""
  p = _row(_rng(request), 4, 100, 0)
  a = _run(p, jnp.float32, block_k=16, num_splits=3)
  b = _run(p, jnp.float32, block_k=16, split_tiles=3)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match="not given with split_tiles"):
    kernel.scheduled_attention(
        jnp.zeros((1, 4, H, D)), jnp.zeros((1, 40, KH, D)),
        jnp.zeros((1, 40, KH, D)), jnp.array([40]), jnp.array([4]),
        scale=1.0, num_splits=2, split_tiles=2, interpret=True)
