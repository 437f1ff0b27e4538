"""Scheduled attention's score prefix and the bits it promises: a row's
output and mass do not depend on the batch it runs in or on the head shard
it runs on, and the fixed-order tree sum behind the mass.

CPU runs the kernel in Pallas interpret mode; GPU-marked tests run Triton.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, kernel, reference
from pallas_kernels.attention.tiling import default_split_tiles, split_count
from tests.attention_case import (MASS_TOL, check as _check, inputs as _inputs,
                                  reference_attention)
from tests.kernel_case import (assert_close, compiled, gpu, gpu_only,
                               rng as _rng)


# (B, Q, H, K, D, S, T, k_lens, q_lens, split_tiles, prefix): block_r covers
# more rows than the prefix's folded rows, so the mass runs on its own tile,
# except in the last case (70 folded rows; every tile is scored as before).
PREFIX_CASES = {
    "g1_one_split": (2, 40, 2, 2, 64, 90, 0, [90, 41], [40, 23], 6, 8),
    "g1_splits_new": (2, 48, 2, 2, 64, 160, 12, [160, 77], [48, 30], 4, 16),
    "g7_splits": (1, 12, 7, 1, 64, 150, 9, [101], [12], 5, 2),
    "g7_prefix_wider_than_a_tile": (1, 12, 7, 1, 64, 150, 0, [150], [12], 10,
                                    10),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(PREFIX_CASES))
def test_score_prefix_scores_the_first_queries_alone(request, name, dtype):
  """score_prefix: the mass of the score rows among the first queries, as
  the reference gives it, and score rows past the prefix are ignored."""
  b, q, h, kh, d, s, t, k_lens, q_lens, split_tiles, prefix = PREFIX_CASES[
      name]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  assert kernel._default_block_r(q * h // kh) > 16  # the prefix tile is smaller
  kw["score_rows_BxQ"] = kw["score_rows_BxQ"].at[:, q - 1].set(True)
  got = api.scheduled_attention(*args, **kw, score_prefix=prefix,
                                implementation="pallas_interpret",
                                block_k=16, split_tiles=split_tiles)
  _check(args, dict(kw, score_prefix=prefix), got, dtype)
  first = kw["score_rows_BxQ"] & (jnp.arange(q) < prefix)[None]
  want = reference_attention(*args, **dict(kw, score_rows_BxQ=first))
  assert_close(got[1], want[1], dtype, table=MASS_TOL)
  everything = reference_attention(*args, **kw)[1]
  assert not np.allclose(np.asarray(everything), np.asarray(want[1]))


@gpu_only
@pytest.mark.parametrize("prefix", [None, 16])
@pytest.mark.parametrize("score", ["mass", "logit"])
def test_triton_score_prefix_at_llada_shapes(request, prefix, score):
  """Flash-Cache's draft pass at LLaDA-8B's heads: 128 queries, the mass of
  the first 16, one key split (the default at 32 heads)."""
  args, kw = _inputs(_rng(request), 3, 128, 32, 32, 128, 1280, 0,
                     [1280, 900, 1], [128, 100, 128], jnp.bfloat16)
  kw["score_rows_BxQ"] = jnp.arange(128)[None].repeat(3, 0) < 16
  kw["score"] = score
  got = api.scheduled_attention(*args, **kw, score_prefix=prefix,
                                implementation="pallas")
  _check(args, dict(kw, score_prefix=prefix), got, jnp.bfloat16)


@pytest.mark.parametrize("impl,dtype,b", [
    ("pallas_interpret", jnp.float32, 9),
    gpu("pallas", jnp.bfloat16, 9), gpu("pallas", jnp.bfloat16, 128)])
def test_a_row_does_not_depend_on_the_batch_it_runs_in(request, impl, dtype,
                                                       b):
  """Default tiling: row 0 alone and row 0 among b - 1 other rows give the
  same bits (output and mass). A split count chosen from the batch size
  changed the order of the key sums between the two calls, and so did an XLA
  merge of the splits compiled per shape; the mass sum over heads and row
  tiles is a fixed tree of adds for the same reason. Also with the mass of
  a score prefix on its own 16-row tile (block_r 32 here)."""
  q, h, kh, d, s = 64, 4, 4, 64, 1024
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, 0,
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
    assert split_count(s, 64, default_split_tiles(kh, q // block_r, s,
                                                  64)) > 1


@pytest.mark.parametrize("n", [1, 3, 32, 96])
def test_tree_sum_is_the_sum_along_one_axis(request, n):
  """The fixed-order tree (the mass over row tiles, then over heads) equals
  jnp.sum exactly on integer-valued floats (every partial sum exact) and to
  rounding on random ones, for counts that are not powers of two too."""
  rng = _rng(request)
  ints = jnp.asarray(rng.integers(-50, 50, (3, n, 4, 70)), jnp.float32)
  for axis in (1, 2):
    np.testing.assert_array_equal(np.asarray(reference.tree_sum(ints, axis)),
                                  np.asarray(jnp.sum(ints, axis=axis)))
  x = jnp.asarray(rng.random((3, n, 70)), jnp.float32)
  np.testing.assert_allclose(np.asarray(reference.sum_heads(x)),
                             np.asarray(jnp.sum(x, axis=1)), rtol=1e-6)


@pytest.mark.parametrize("impl,dtype", [
    ("pallas_interpret", jnp.float32), ("reference", jnp.float32),
    gpu("pallas", jnp.float32), gpu("pallas", jnp.bfloat16)])
def test_a_head_shard_gives_its_heads_bits(request, impl, dtype):
  """What a device of a tensor-parallel mesh runs: the kernel on a slice of
  the KV heads with the key split size of the global shapes
  (`split_tiles_for`) gives that slice of the one-device output and
  per-head mass, bit for bit; `sum_heads` of the per-head mass is the
  default mass. With 4 programs a sequence one device takes one split; a
  shard, with fewer, would split its keys if it chose from its own shapes."""
  tiling = api.Tiling(split_target=4)
  b, q, h, kh, d, s = 2, 8, 8, 4, 64, 1024
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, 6, [1000, 700],
                     [8, 5], dtype)
  split_tiles = api.split_tiles_for(args[0].shape, args[1].shape,
                                    tiling=tiling)
  assert split_tiles == s // 64  # one split
  # One program a shape, as a device runs it (the reference op by op would
  # compile each op).
  run = lambda a, **k: compiled(api.scheduled_attention)(
      *a, **{**kw, **k}, implementation=impl, split_tiles=split_tiles)
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
    assert api.split_tiles_for(part[0].shape, part[1].shape,
                               tiling=tiling) == tiling.split_tiles
