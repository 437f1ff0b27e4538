"""Scheduled attention (pallas_kernels/attention) vs its plain-JAX reference.

CPU runs the kernel in Pallas interpret mode; GPU-marked tests run Triton
(tests/conftest.py defaults JAX_PLATFORMS to cpu: run them with
JAX_PLATFORMS=cuda).
Cache slots past k_len, excluded slots and padded query rows are NaN-poisoned,
so any read of them, or any output element left unwritten, fails.
"""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, kernel, reference

ON_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")
TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5),
       jnp.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _key(request):
  return jax.random.key(zlib.crc32(request.node.name.encode()))


def _inputs(key, b, q, h, kh, d, s, t, k_lens, q_lens, dtype, excl=True,
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


def _check(args, kw, got, dtype):
  want_o, want_m = reference.scheduled_attention(*args, **kw)
  o = np.asarray(got[0], np.float32)
  assert np.isfinite(o).all(), "NaN/inf in attention output"
  np.testing.assert_allclose(o, np.asarray(want_o, np.float32), **TOL[dtype])
  pad = np.arange(o.shape[1])[None, :] >= np.asarray(args[4])[:, None]
  assert (o[pad] == 0).all(), "padded query rows must be zero"
  if "score_rows_BxQ" not in kw:
    assert got[1] is None
    return
  mass = np.asarray(got[1])
  assert np.isfinite(mass).all()
  np.testing.assert_allclose(mass, np.asarray(want_m), rtol=1e-4,
                             atol=1e-4 if dtype == jnp.float32 else 1e-2)
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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(request, name, dtype):
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, splits = CASES[name]
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=block_k, num_splits=splits)
  _check(args, kw, got, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name,prefix", [("g4_d128_new", None),
                                         ("g7_d128_split", None),
                                         ("g1_d128_long", 4)])
def test_logit_score_matches_reference(request, name, prefix, dtype):
  """score="logit": the summed pre-softmax q.k per key (Flash-dLLM's ranking
  of decoded tokens), fused, after a split merge, and on a prefix tile."""
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, splits = CASES[name]
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  kw.update(score="logit", score_prefix=prefix)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=block_k, num_splits=splits)
  _check(args, kw, got, dtype)
  mass = reference.scheduled_attention(*args, **dict(kw, score="mass"))[1]
  assert (np.asarray(got[1]) < 0).any() and not np.allclose(got[1], mass)


@pytest.mark.parametrize("excl,score,t", [(False, False, 0), (True, False, 8),
                                          (False, True, 8)])
def test_optional_inputs(request, excl, score, t):
  args, kw = _inputs(_key(request), 2, 6, 4, 2, 64, 50, t, [50, 19], [6, 4],
                     jnp.float32, excl=excl, score=score)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=16)
  _check(args, kw, got, jnp.float32)


def test_fully_masked_rows_are_zero(request):
  """No cache keys and no in-query keys for some rows: zeros, not NaN."""
  args, kw = _inputs(_key(request), 2, 4, 4, 1, 64, 32, 6, [0, 0], [4, 2],
                     jnp.bfloat16, t_frac=0.0)
  kw["inq_mask_BxQxI"] = kw["inq_mask_BxQxI"].at[0, 1, 2].set(True)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=16, num_splits=2)
  _check(args, kw, got, jnp.bfloat16)
  o = np.asarray(got[0], np.float32)
  assert (o[0, [0, 2, 3]] == 0).all() and (o[0, 1] != 0).any()


def test_exclude_list_matches_mask(request):
  args, kw = _inputs(_key(request), 2, 4, 2, 2, 64, 45, 0, [45, 30], [4, 4],
                     jnp.float32, excl=False)
  ex_BxX = jnp.array([[3, 17, 44, -1], [0, 29, -1, -1]], jnp.int32)
  mask_BxS = reference.exclude_mask_from_positions(ex_BxX, 45)
  assert np.asarray(mask_BxS).sum() == 5
  got = api.scheduled_attention(*args, **kw, exclude_BxX=ex_BxX,
                                implementation="pallas_interpret", block_k=16)
  kw["exclude_BxS"] = mask_BxS
  _check(args, kw, got, jnp.float32)


def test_reference_agrees_with_masked_attention(request):
  """Without new keys, exclusions or padding: the existing dense reference."""
  args, kw = _inputs(_key(request), 2, 5, 8, 2, 64, 40, 0, [40, 27], [5, 5],
                     jnp.float32, excl=False)
  o, mass = reference.scheduled_attention(*args, **kw)
  valid = jnp.arange(40)[None, :] < args[3][:, None]
  k = jnp.where(valid[..., None, None], args[1], 0)
  v = jnp.where(valid[..., None, None], args[2], 0)
  dense = reference.masked_attention(args[0], k, v, valid, scale=kw["scale"])
  np.testing.assert_allclose(np.asarray(o), np.asarray(dense), rtol=1e-5,
                             atol=1e-5)
  # Each score row spreads mass 1 per head over the cache keys.
  rows = np.asarray(kw["score_rows_BxQ"]).sum(1) * 8
  np.testing.assert_allclose(np.asarray(mass).sum(1), rows, rtol=1e-5)


def test_unsupported_shapes_fall_back(request):
  args, kw = _inputs(_key(request), 1, 3, 2, 1, 48, 20, 0, [20], [3],
                     jnp.float32)
  with pytest.raises(NotImplementedError):
    kernel.scheduled_attention(*args, **kw, interpret=True)
  _check(args, kw, api.scheduled_attention(
      *args, **kw, implementation="pallas_interpret"), jnp.float32)
  _check(args, kw, api.scheduled_attention(*args, **kw), jnp.float32)


# (B, Q, H, K, D, S, T, k_lens, q_lens, splits, prefix): block_r covers
# more rows than the prefix's folded rows, so the mass runs on its own tile,
# except in the last case (70 folded rows; every tile is scored as before).
PREFIX_CASES = {
    "g1_one_split": (2, 40, 2, 2, 64, 90, 0, [90, 41], [40, 23], 1, 8),
    "g1_splits_new": (2, 48, 2, 2, 64, 160, 12, [160, 77], [48, 30], 3, 16),
    "g7_splits": (1, 12, 7, 1, 64, 150, 9, [101], [12], 2, 2),
    "g7_prefix_wider_than_a_tile": (1, 12, 7, 1, 64, 150, 0, [150], [12], 1,
                                    10),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(PREFIX_CASES))
def test_score_prefix_scores_the_first_queries_alone(request, name, dtype):
  """score_prefix: the mass of the score rows among the first queries, as
  the reference gives it, and score rows past the prefix are ignored."""
  b, q, h, kh, d, s, t, k_lens, q_lens, splits, prefix = PREFIX_CASES[name]
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  assert kernel._default_block_r(q * h // kh) > 16  # the prefix tile is smaller
  kw["score_rows_BxQ"] = kw["score_rows_BxQ"].at[:, q - 1].set(True)
  got = api.scheduled_attention(*args, **kw, score_prefix=prefix,
                                implementation="pallas_interpret",
                                block_k=16, num_splits=splits)
  _check(args, dict(kw, score_prefix=prefix), got, dtype)
  first = kw["score_rows_BxQ"] & (jnp.arange(q) < prefix)[None]
  want = reference.scheduled_attention(*args, **dict(kw, score_rows_BxQ=first))
  np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]),
                             rtol=1e-4, atol=1e-4 if dtype == jnp.float32
                             else 1e-2)
  everything = reference.scheduled_attention(*args, **kw)[1]
  assert not np.allclose(np.asarray(everything), np.asarray(want[1]))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("prefix", [None, 16])
@pytest.mark.parametrize("score", ["mass", "logit"])
def test_triton_score_prefix_at_llada_shapes(request, prefix, score):
  """Flash-Cache's draft pass at LLaDA-8B's heads: 128 queries, the mass of
  the first 16, one key split (the default at 32 heads)."""
  args, kw = _inputs(_key(request), 3, 128, 32, 32, 128, 1280, 0,
                     [1280, 900, 1], [128, 100, 128], jnp.bfloat16)
  kw["score_rows_BxQ"] = jnp.arange(128)[None].repeat(3, 0) < 16
  kw["score"] = score
  got = api.scheduled_attention(*args, **kw, score_prefix=prefix,
                                implementation="pallas")
  _check(args, dict(kw, score_prefix=prefix), got, jnp.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES) + ["llada", "dream"])
def test_triton_matches_reference(request, name, dtype):
  big = {"llada": (4, 32, 32, 32, 128, 1024, 32, [1024, 700, 1, 0],
                   [32, 17, 32, 5], 64, 1),
         "dream": (2, 16, 28, 4, 128, 2048, 16, [2000, 1500], [16, 9], 64, 4)}
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, splits = {**CASES, **big}[name]
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  got = api.scheduled_attention(*args, **kw, implementation="pallas",
                                block_k=block_k, num_splits=splits)
  _check(args, kw, got, dtype)


@pytest.mark.parametrize("impl,dtype,b", [
    ("pallas_interpret", jnp.float32, 9),
    pytest.param("pallas", jnp.bfloat16, 9, marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")]),
    pytest.param("pallas", jnp.bfloat16, 128, marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")])])
def test_a_row_does_not_depend_on_the_batch_it_runs_in(request, impl, dtype,
                                                       b):
  """Default tiling: row 0 alone and row 0 among b - 1 other rows give the
  same bits (output and mass). A split count chosen from the batch size
  changed the order of the key sums between the two calls, and so did an XLA
  merge of the splits compiled per shape; the mass sum over heads and row
  tiles is a fixed tree of adds for the same reason. Also with the mass of
  a score prefix on its own 16-row tile (block_r 32 here)."""
  q, h, kh, d, s = 64, 4, 4, 64, 1024
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, 0,
                     [1000] + [900] * (b - 1), [q] * b, dtype)
  for block_r, prefix in ((16, None), (32, 8)):
    run = lambda a, k: api.scheduled_attention(
        *a, **k, implementation=impl, block_r=block_r, score_prefix=prefix)
    batch = run(args, kw)
    alone = run(tuple(x[:1] for x in args),
                {k: v[:1] if hasattr(v, "shape") else v
                 for k, v in kw.items()})
    np.testing.assert_array_equal(np.asarray(alone[0], np.float32),
                                  np.asarray(batch[0][:1], np.float32))
    np.testing.assert_array_equal(np.asarray(alone[1]),
                                  np.asarray(batch[1][:1]))
    # The splits really are > 1 here, so the test exercises the combine.
    assert kernel.default_splits(kh, q // block_r, s, 64) > 1


@pytest.mark.parametrize("n", [1, 3, 32, 96])
def test_tree_sum_is_the_sum_along_one_axis(request, n):
  """The fixed-order tree (the mass over row tiles, then over heads) equals
  jnp.sum exactly on integer-valued floats (every partial sum exact) and to
  rounding on random ones, for counts that are not powers of two too."""
  ints = jax.random.randint(_key(request), (3, n, 4, 70), -50, 50
                            ).astype(jnp.float32)
  for axis in (1, 2):
    np.testing.assert_array_equal(np.asarray(reference.tree_sum(ints, axis)),
                                  np.asarray(jnp.sum(ints, axis=axis)))
  x = jax.random.uniform(_key(request), (3, n, 70))
  np.testing.assert_allclose(np.asarray(reference.sum_heads(x)),
                             np.asarray(jnp.sum(x, axis=1)), rtol=1e-6)


@pytest.mark.parametrize("impl,dtype", [
    ("pallas_interpret", jnp.float32), ("reference", jnp.float32),
    pytest.param("pallas", jnp.float32, marks=pytest.mark.gpu),
    pytest.param("pallas", jnp.bfloat16, marks=pytest.mark.gpu)])
def test_a_head_shard_gives_its_heads_bits(request, impl, dtype):
  """What a device of a tensor-parallel mesh runs: the kernel on a slice of
  the KV heads with the key splits of the global shapes (`splits_for`)
  gives that slice of the one-device output and per-head mass, bit for
  bit; `sum_heads` of the per-head mass is the default mass. With 8
  programs a sequence, the shard's own default would take other splits."""
  tiling = api.Tiling(split_target=8)
  b, q, h, kh, d, s = 2, 8, 8, 4, 64, 1024
  args, kw = _inputs(_key(request), b, q, h, kh, d, s, 6, [1000, 700],
                     [8, 5], dtype)
  splits = api.splits_for(args[0].shape, args[1].shape, tiling=tiling)
  assert splits == 2
  run = lambda a, **k: api.scheduled_attention(
      *a, **{**kw, **k}, implementation=impl, num_splits=splits)
  o, mass_BxKxS = run(args, head_mass=True)
  np.testing.assert_array_equal(np.asarray(api.sum_heads(mass_BxKxS)),
                                np.asarray(run(args)[1]))
  g = h // kh
  for k0, k1 in [(0, 2), (2, 4), (3, 4)]:
    part = (args[0][:, :, k0 * g:k1 * g], args[1][:, :, k0:k1],
            args[2][:, :, k0:k1], *args[3:])
    new = {n: kw[n][:, :, k0:k1] for n in ("k_new_BxIxKxD", "v_new_BxIxKxD")}
    o_part, mass_part = run(part, head_mass=True, **new)
    np.testing.assert_array_equal(np.asarray(o_part),
                                  np.asarray(o[:, :, k0 * g:k1 * g]))
    np.testing.assert_array_equal(np.asarray(mass_part),
                                  np.asarray(mass_BxKxS[:, k0:k1]))
    assert api.splits_for(part[0].shape, part[1].shape,
                          tiling=tiling) != splits
