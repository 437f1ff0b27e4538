"""Scheduled attention (pallas_kernels/attention) vs its plain-JAX reference.

CPU runs the kernel in Pallas interpret mode; GPU-marked tests run Triton
(tests/conftest.py defaults JAX_PLATFORMS to cpu: run them with
JAX_PLATFORMS=cuda).
Cache slots past k_len, excluded slots and padded query rows are NaN-poisoned,
so any read of them, or any output element left unwritten, fails.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, kernel, reference
from tests.attention_case import (CASES, check as _check, inputs as _inputs,
                                  reference_attention)
from tests.kernel_case import gpu_only, rng as _rng


# Every case in float32; bfloat16 on one case per path that rounds
# differently: new keys in the query's tile, a split merge (with an empty
# row), and a long cache over several splits.
BF16_CASES = ["g4_d128_new", "g4_d64_split", "g1_d128_long"]


@pytest.mark.parametrize("name,dtype", [
    *[pytest.param(n, jnp.float32, id=f"{n}-f32") for n in CASES],
    *[pytest.param(n, jnp.bfloat16, id=f"{n}-bf16") for n in BF16_CASES]])
def test_matches_reference(request, name, dtype):
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, split_tiles = CASES[name]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=block_k, split_tiles=split_tiles)
  _check(args, kw, got, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name,prefix", [("g4_d128_new", None),
                                         ("g7_d128_split", None),
                                         ("g1_d128_long", 4)])
def test_logit_score_matches_reference(request, name, prefix, dtype):
  """score="logit": the summed pre-softmax q.k per key (Flash-dLLM's ranking
  of decoded tokens), fused, after a split merge, and on a prefix tile."""
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, split_tiles = CASES[name]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  kw.update(score="logit", score_prefix=prefix)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=block_k, split_tiles=split_tiles)
  _check(args, kw, got, dtype)
  mass = reference_attention(*args, **dict(kw, score="mass"))[1]
  assert (np.asarray(got[1]) < 0).any() and not np.allclose(got[1], mass)


@pytest.mark.parametrize("excl,score,t", [(False, False, 0), (True, False, 8),
                                          (False, True, 8)])
def test_optional_inputs(request, excl, score, t):
  args, kw = _inputs(_rng(request), 2, 6, 4, 2, 64, 50, t, [50, 19], [6, 4],
                     jnp.float32, excl=excl, score=score)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=16)
  _check(args, kw, got, jnp.float32)


def test_fully_masked_rows_are_zero(request):
  """No cache keys and no in-query keys for some rows: zeros, not NaN."""
  args, kw = _inputs(_rng(request), 2, 4, 4, 1, 64, 32, 6, [0, 0], [4, 2],
                     jnp.bfloat16, t_frac=0.0)
  kw["inq_mask_BxQxI"] = kw["inq_mask_BxQxI"].at[0, 1, 2].set(True)
  got = api.scheduled_attention(*args, **kw, implementation="pallas_interpret",
                                block_k=16, split_tiles=1)
  _check(args, kw, got, jnp.bfloat16)
  o = np.asarray(got[0], np.float32)
  assert (o[0, [0, 2, 3]] == 0).all() and (o[0, 1] != 0).any()


def test_exclude_list_matches_mask(request):
  args, kw = _inputs(_rng(request), 2, 4, 2, 2, 64, 45, 0, [45, 30], [4, 4],
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
  args, kw = _inputs(_rng(request), 2, 5, 8, 2, 64, 40, 0, [40, 27], [5, 5],
                     jnp.float32, excl=False)
  o, mass = reference_attention(*args, **kw)
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
  args, kw = _inputs(_rng(request), 1, 3, 2, 1, 48, 20, 0, [20], [3],
                     jnp.float32)
  with pytest.raises(NotImplementedError):
    kernel.scheduled_attention(*args, **kw, interpret=True)
  _check(args, kw, api.scheduled_attention(
      *args, **kw, implementation="pallas_interpret"), jnp.float32)
  _check(args, kw, api.scheduled_attention(*args, **kw), jnp.float32)


@gpu_only
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES) + ["llada", "dream"])
def test_triton_matches_reference(request, name, dtype):
  big = {"llada": (4, 32, 32, 32, 128, 1024, 32, [1024, 700, 1, 0],
                   [32, 17, 32, 5], 64, 16),
         "dream": (2, 16, 28, 4, 128, 2048, 16, [2000, 1500], [16, 9], 64, 4)}
  b, q, h, kh, d, s, t, k_lens, q_lens, block_k, split_tiles = {
      **CASES, **big}[name]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, t, k_lens, q_lens,
                     dtype)
  got = api.scheduled_attention(*args, **kw, implementation="pallas",
                                block_k=block_k, split_tiles=split_tiles)
  _check(args, kw, got, dtype)
