"""The Mosaic GPU scheduled attention (pallas_kernels/attention/mosaic.py) in
Mosaic GPU's interpret mode on the CPU against the plain-JAX reference:
exclusions, ragged k_len / q_len, key splits and split groups, the mass and
logit scores (whole rows or a score prefix, per head or summed), the bits a
row keeps alone or in a batch and under left padding of its keys by
multiples of 64 excluded slots, and what it does not take falling through
the api to the Triton kernel; its lowering for CUDA at LLaDA-8B's and
Dream-7B's shapes, on the CPU. GPU-marked tests run the compiled kernel
(JAX_PLATFORMS=cuda).

Interpret mode runs the kernel's two products as XLA dots (mosaic_kernels.Ops:
jax 0.10's interpreter runs no transposed or register wgmma operand), so
the wgmma instructions themselves are checked by the lowering and GPU tests.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.attention import api, mosaic, reference
from pallas_kernels.attention.tiling import Tiling, key_splits, split_count
from tests.attention_case import check as _check, inputs as _inputs
from tests.kernel_case import gpu_only, rng as _rng

BF16 = jnp.bfloat16


@pytest.fixture(autouse=True)
def _fresh_interpreter():
  """An interpreted kernel that raised leaves state the next one trips on."""
  mosaic.reset_interpret_state()
  yield


def _run(args, kw, **options):
  return mosaic.scheduled_attention(*args, **kw, interpret=True, **options)


def _np(result):
  o, mass = result
  return np.asarray(o, np.float32), None if mass is None else np.asarray(mass)


# (B, Q, H, K, D, S, k_lens, q_lens, options): one split (the default rule
# at 2 programs a sequence: 4 tiles a split, S = 192 is 3), three splits of
# 2 tiles with an empty first split at k_len 77, two row tiles (80 folded
# rows) over 4 one-tile splits run 3 a program, and an empty sequence.
CASES = {
    "g2_d64_one_split": (2, 16, 4, 2, 64, 192, [192, 100], [16, 11], {}),
    "g1_d128_splits": (2, 32, 4, 4, 128, 320, [320, 77], [32, 20],
                       dict(split_tiles=2)),
    "g4_d64_groups": (2, 20, 4, 1, 64, 256, [250, 129], [20, 7],
                      dict(split_tiles=1, split_group=3)),
    "g2_d64_empty_row": (2, 16, 4, 2, 64, 128, [0, 128], [16, 16],
                         dict(split_tiles=1)),
}
# (case, score, score_prefix, head_mass)
SCORES = [
    ("g2_d64_one_split", None, None, False),
    ("g2_d64_one_split", "mass", None, True),
    ("g1_d128_splits", None, None, False),
    ("g1_d128_splits", "logit", 4, False),
    ("g4_d64_groups", "mass", None, False),
    ("g4_d64_groups", "logit", None, True),
    ("g2_d64_empty_row", "mass", 2, False),
]


@pytest.mark.parametrize("name,score,prefix,head_mass", SCORES,
                         ids=[f"{c[0]}-{c[1]}-p{c[2]}-h{int(c[3])}"
                              for c in SCORES])
def test_matches_reference(request, name, score, prefix, head_mass):
  b, q, h, kh, d, s, k_lens, q_lens, options = CASES[name]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, 0, k_lens, q_lens, BF16,
                     score=score is not None)
  if score is not None:
    kw.update(score=score, score_prefix=prefix)
  got = _run(args, kw, head_mass=head_mass, **options)
  if head_mass:
    assert got[1].shape == (b, kh, s)
    got = (got[0], api.sum_heads(got[1]))
  _check(args, kw, got, BF16)
  if score == "logit":
    assert (np.asarray(got[1]) < 0).any()


def test_fully_masked_rows_are_zero(request):
  """No valid key (k_len 0, or every slot excluded): zeros, not NaN."""
  args, kw = _inputs(_rng(request), 2, 16, 4, 2, 64, 128, 0, [0, 128],
                     [16, 16], BF16)
  kw["exclude_BxS"] = kw["exclude_BxS"].at[1].set(True)
  o, mass = _np(_run(args, kw))
  assert (o == 0).all() and (mass == 0).all()


def test_the_api_runs_it(request):
  """implementation='mosaic_interpret' is this kernel, bit for bit, and an
  exclusion list is the mask it makes."""
  args, kw = _inputs(_rng(request), 2, 16, 4, 2, 64, 192, 0, [192, 150],
                     [16, 12], BF16, excl=False)
  ex_BxX = jnp.array([[3, 17, 130, -1], [0, 149, -1, -1]], jnp.int32)
  got = _np(api.scheduled_attention(*args, **kw, exclude_BxX=ex_BxX,
                                    implementation="mosaic_interpret"))
  kw["exclude_BxS"] = reference.exclude_mask_from_positions(ex_BxX, 192)
  want = _np(_run(args, kw))
  for x, y in zip(got, want):
    np.testing.assert_array_equal(x, y)
  _check(args, kw, got, BF16)


def _alone_and_in_batch(args, kw, **options):
  batch = _np(_run(args, kw, **options))
  alone = _np(_run(tuple(x[:1] for x in args),
                   {k: v[:1] if hasattr(v, "shape") else v
                    for k, v in kw.items()}, **options))
  for x, y in zip(alone, batch):
    np.testing.assert_array_equal(x, y[:1])


@pytest.mark.parametrize("prefix", [None, 2])
def test_a_row_does_not_depend_on_the_batch_it_runs_in(request, prefix):
  """Row 0 alone and among 2 other rows: the same bits, output and mass,
  with key splits whose group follows the batch (tiling.group_target: 2
  programs a row tile alone, 1 in the batch)."""
  tiling = Tiling(split_target=4, split_tiles=1, group_target=8)
  b, q, h, kh, d, s = 3, 16, 4, 2, 64, 256
  assert key_splits(1, kh, 1, s, 64, tiling=tiling)[1:] == (4, 1)
  assert key_splits(b, kh, 1, s, 64, tiling=tiling)[1:] == (4, 4)
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, 0, [250, 200, 64],
                     [16, 16, 9], BF16)
  _alone_and_in_batch(args, dict(kw, score_prefix=prefix), tiling=tiling)


@pytest.mark.parametrize("score", ["mass", "logit"])
def test_a_split_group_keeps_the_bits(request, score):
  """Groups of 2 and 3 of 5 one-tile splits: group 1's bits."""
  args, kw = _inputs(_rng(request), 2, 16, 4, 2, 64, 320, 0, [320, 190],
                     [16, 13], BF16)
  kw["score"] = score
  run = lambda g: _np(_run(args, kw, split_tiles=1, split_group=g,
                           head_mass=True))
  want = run(1)
  for g in (2, 3):
    for x, y in zip(run(g), want):
      np.testing.assert_array_equal(x, y, f"group {g}")


def _padded(args, kw, pad, fill):
  """The problem with `pad` excluded slots holding `fill` in front of each
  row's cache, k_len grown by as much."""
  front = lambda x: jnp.concatenate(
      [jnp.full(x.shape[:1] + (pad,) + x.shape[2:], fill, x.dtype), x], 1)
  q, k, v, k_len, q_len = args
  ex = jnp.concatenate([jnp.ones((k.shape[0], pad), bool), kw["exclude_BxS"]],
                       1)
  return (q, front(k), front(v), k_len + pad, q_len), dict(kw, exclude_BxS=ex)


# (S, k_lens, options, pads): splits of the unpadded layout.
LAYOUTS = {
    "several_splits": (192, [192, 150], dict(split_tiles=1), (64, 128)),  # 3
    "one_then_more": (128, [128, 100], dict(split_tiles=2), (64, 192)),  # 1
    "default_rule": (256, [256, 200], {}, (64,)),  # 4 tiles a split: 1 -> 2
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_left_padding_keeps_the_bits(request, layout):
  """Output and mass (from the padded slots on) with 64 or more excluded
  slots of NaN or 1e4 in front: the unpadded bits; the pad's mass is 0."""
  s, k_lens, options, pads = LAYOUTS[layout]
  args, kw = _inputs(_rng(request), 2, 16, 4, 2, 64, s, 0, k_lens, [16, 14],
                     BF16)
  kw.update(score="mass", score_prefix=4)
  want_o, want_m = _np(_run(args, kw, head_mass=True, **options))
  assert np.isfinite(want_o).all() and (want_m != 0).any()
  st = options.get("split_tiles") or api.split_tiles_for(
      args[0].shape, args[1].shape)
  counts = [split_count(s + pad, 64, st) for pad in (0, *pads)]
  assert len(set(counts)) == len(counts), counts
  for pad, fill in zip(pads, (np.nan, 1e4)):
    p_args, p_kw = _padded(args, kw, pad, fill)
    got_o, got_m = _np(_run(p_args, p_kw, head_mass=True, **options))
    np.testing.assert_array_equal(got_o, want_o, f"o, pad {pad}")
    np.testing.assert_array_equal(got_m[..., pad:], want_m, f"mass, pad {pad}")
    assert (got_m[..., :pad] == 0).all()


# What mosaic.scheduled_attention does not take: (case, the message).
UNSUPPORTED = {
    "in_query_keys": "in-query keys",
    "float32": "bfloat16 only",
    "s_not_a_multiple_of_64": "multiple of 64",
    "head_dim_32": "head_dim 32",
    "block_r_32": "64 rows",
}


def _unsupported(request, case):
  s, d, t, dtype, options = 128, 64, 0, BF16, {}
  if case == "in_query_keys":
    t = 8
  elif case == "float32":
    dtype = jnp.float32
  elif case == "s_not_a_multiple_of_64":
    s = 100
  elif case == "head_dim_32":
    d = 32
  elif case == "block_r_32":
    options = dict(block_r=32)
  args, kw = _inputs(_rng(request), 2, 8, 4, 2, d, s, t, [s, s - 30], [8, 5],
                     dtype)
  return args, kw, options, dtype


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_what_it_cannot_take_falls_through_to_triton(request, case):
  args, kw, options, dtype = _unsupported(request, case)
  with pytest.raises(NotImplementedError, match=UNSUPPORTED[case]):
    _run(args, kw, **options)
  got = _np(api.scheduled_attention(*args, **kw, **options,
                                    implementation="mosaic_interpret"))
  want = _np(api.scheduled_attention(*args, **kw, **options,
                                     implementation="pallas_interpret"))
  for x, y in zip(got, want):
    np.testing.assert_array_equal(x, y)
  _check(args, kw, got, dtype)


def test_mosaic_is_not_the_default():
  assert {"mosaic", "mosaic_interpret"} <= set(api.IMPLEMENTATIONS)
  assert api.resolve_implementation(None) in ("pallas", "reference")
  with pytest.raises(ValueError, match="implementation must be one of"):
    api.scheduled_attention(*(jnp.zeros(1),) * 5, scale=1.0,
                            implementation="mosaic_gpu")


S = jax.ShapeDtypeStruct
# (B, Q, H, K, S, score, prefix, split_tiles, splits): LLaDA-8B's
# Flash-Cache step at batch 32 (the mass of its 16-query window, and a
# layer without it), at batch 1 with its 5 key splits (split_target 132),
# Dream-7B's heads (default: 4 tiles a split).
LOWERINGS = {
    "llada_b32_mass": (32, 128, 32, 32, 1280, "mass", 16, None, 1),
    "llada_b32_no_score": (32, 128, 32, 32, 1280, None, None, None, 1),
    "llada_b1_splits_logit": (1, 128, 32, 32, 1280, "logit", 16, 4, 5),
    "dream_b4": (4, 128, 28, 4, 2048, "mass", None, None, 1),
    "dream_b1_q16": (1, 16, 28, 4, 1280, "mass", 16, None, 5),
}


@pytest.mark.parametrize("name", list(LOWERINGS))
def test_lowers_for_cuda_on_the_cpu(name):
  """The compiled path through Mosaic GPU's lowering (TMA tiles, wgmma
  operand transposes and swizzles, register layouts), without a GPU: the
  attention and the mass as Mosaic GPU calls, the split merge (splits > 1)
  a Triton call. PTX is made only on a GPU."""
  b, q, h, kh, s, score, prefix, split_tiles, splits = LOWERINGS[name]
  d = 128
  shapes = (S((b, q, h, d), BF16), S((b, s, kh, d), BF16),
            S((b, s, kh, d), BF16), S((b,), jnp.int32), S((b,), jnp.int32),
            S((b, s), bool), S((b, q), bool))
  st = split_tiles or api.split_tiles_for(shapes[0].shape, shapes[1].shape)
  assert split_count(s, 64, st) == splits

  def run(qq, kc, vc, kl, ql, ex, rows):
    return mosaic.scheduled_attention(
        qq, kc, vc, kl, ql, scale=1.0, exclude_BxS=ex,
        score_rows_BxQ=None if score is None else rows, score_prefix=prefix,
        score=score or "mass", split_tiles=split_tiles)

  text = jax.jit(run).trace(*shapes).lower(
      lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"custom_call @([\w$.]+)", text)
  want = (["mosaic_gpu_v2"] + ["__gpu$xla.gpu.triton"] * (splits > 1)
          + ["mosaic_gpu_v2"] * (score is not None))
  assert calls == want


def _gpu_case(request, b, q, h, kh, s, k_lens, q_lens):
  args, kw = _inputs(_rng(request), b, q, h, kh, 128, s, 0, k_lens, q_lens,
                     BF16)
  kw["score_rows_BxQ"] = jnp.arange(q)[None].repeat(b, 0) < 16
  return args, kw


GPU_SHAPES = {  # (B, Q, H, K, S, k_lens, q_lens, options)
    "llada": (4, 128, 32, 32, 1280, [1280, 900, 1, 0], [128, 100, 128, 5],
              {}),
    "llada_splits": (2, 128, 32, 32, 2048, [2048, 1500], [128, 128],
                     dict(split_tiles=4)),
    "dream": (2, 128, 28, 4, 2048, [2000, 1500], [128, 90], {}),
}


@gpu_only
@pytest.mark.parametrize("prefix", [None, 16])
@pytest.mark.parametrize("score", ["mass", "logit"])
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_gpu_matches_reference_and_triton(request, name, score, prefix):
  b, q, h, kh, s, k_lens, q_lens, options = GPU_SHAPES[name]
  args, kw = _gpu_case(request, b, q, h, kh, s, k_lens, q_lens)
  kw.update(score=score, score_prefix=prefix)
  got = mosaic.scheduled_attention(*args, **kw, **options)
  _check(args, kw, got, BF16)
  triton = api.scheduled_attention(*args, **kw, **options,
                                   implementation="pallas")
  _check(args, kw, triton, BF16)
  np.testing.assert_allclose(np.asarray(got[0], np.float32),
                             np.asarray(triton[0], np.float32), rtol=2e-2,
                             atol=2e-2)
  text = jax.jit(lambda *a: mosaic.scheduled_attention(
      *a, **kw, **options)).lower(*args).as_text()
  assert "mosaic_gpu" in text


@gpu_only
@pytest.mark.parametrize("name", ["llada", "llada_splits"])
def test_gpu_rows_keep_their_bits(request, name):
  """Compiled: a row alone and in the batch, and under 128 slots of left
  padding, gives the same bits."""
  b, q, h, kh, s, k_lens, q_lens, options = GPU_SHAPES[name]
  args, kw = _gpu_case(request, b, q, h, kh, s, [s] * b, q_lens)
  kw["score_prefix"] = 16
  run = lambda a, k: _np(mosaic.scheduled_attention(*a, **k, **options))
  want = run(args, kw)
  alone = run(tuple(x[:1] for x in args),
              {k: v[:1] if hasattr(v, "shape") else v for k, v in kw.items()})
  for x, y in zip(alone, want):
    np.testing.assert_array_equal(x, y[:1])
  got_o, got_m = run(*_padded(args, kw, 128, np.nan))
  np.testing.assert_array_equal(got_o, want[0])
  np.testing.assert_array_equal(got_m[..., 128:], want[1])


def test_kernels_attention_backend_mosaic_runs_the_mosaic_kernel(
    monkeypatch):
  """ops.cached_attention under Kernels(attention_backend="mosaic") asks the
  api for Mosaic GPU (its interpret mode under "pallas_interpret") and
  returns that kernel's bits; the default Kernels asks for Triton."""
  from flash_dllm_jax import ops
  r = np.random.default_rng(3)
  arr = lambda *shape: jnp.asarray(r.standard_normal(shape), BF16)
  q, kc, vc = arr(1, 16, 4, 64), arr(1, 128, 2, 64), arr(1, 128, 2, 64)
  valid = jnp.asarray(np.arange(128)[None] < 100)
  asked = []
  real = api.scheduled_attention
  monkeypatch.setattr(api, "scheduled_attention", lambda *a, implementation,
                      **kw: (asked.append(implementation), real(
                          *a, implementation=implementation, **kw))[1])
  run = lambda kernels: ops.cached_attention(q, kc, vc, valid,
                                             implementation=kernels)
  got, _ = run(ops.Kernels("pallas_interpret", attention_backend="mosaic"))
  assert asked[-1] == "mosaic_interpret"
  want, _ = real(q, kc, vc, jnp.full((1,), 128, jnp.int32),
                 jnp.full((1,), 16, jnp.int32), scale=1.0, exclude_BxS=~valid,
                 implementation="mosaic_interpret")
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))
  run(ops.Kernels("pallas_interpret"))
  assert asked[-1] == "pallas_interpret"
