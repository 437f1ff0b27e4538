"""The Mosaic GPU grouped GEMM (pallas_kernels/grouped_matmul/mosaic.py) in
Mosaic GPU's interpret mode on the CPU against the plain-JAX reference
(group patterns with empty tiles, SwiGLU, 64- and 128-row tiles, int8 and
e4m3 stacks), a
token's bits independent of the tokens routed beside it, what it does not
take falling through to Triton, and its lowering for CUDA at LLaDA2.0-mini's
expert shapes on the CPU. GPU-marked tests run the compiled kernel
(JAX_PLATFORMS=cuda).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from pallas_kernels.grouped_matmul import api, layout, mosaic, reference
from pallas_kernels.qmatmul.reference import FP8, quantize
from tests.kernel_case import (assert_close, compiled, f32, gpu_only, normal,
                               rng)

BF16 = jnp.bfloat16


@pytest.fixture(autouse=True)
def _fresh_interpreter():
  """An interpreted kernel that raised leaves state the next one trips on."""
  mosaic.reset_interpret_state()
  yield


FORMATS = {"bf16": None, "int8": jnp.int8, "fp8": FP8}


def _stack(r, x, i, o, fmt="bf16", group=None):
  """(kernel [X, I, O],) bf16, or 8-bit (kernel_q [X, O, I], scale)."""
  if fmt == "bf16":
    return (normal(r, (x, i, o), BF16, i ** -0.5),)
  qs = [quantize(normal(r, (o, i), jnp.float32, i ** -0.5), FORMATS[fmt],
                 group) for _ in range(x)]
  return jnp.stack([q for q, _ in qs]), jnp.stack([s for _, s in qs])


def _bits(y):
  return np.asarray(jax.lax.bitcast_convert_type(y, jnp.uint16))


# tile_expert patterns over 3 experts: mixed with an empty tile, one expert
# over several tiles beside empty ones, every tile empty.
GROUPS = {"mixed": [1, -1, 0, 2], "one_expert": [2, 2, 2, -1],
          "all_empty": [-1, -1]}


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("groups", list(GROUPS))
def test_matches_reference(request, groups, swiglu):
  r = rng(request)
  tm, i, o = 64, 128, 64
  te = jnp.asarray(GROUPS[groups], jnp.int32)
  x = normal(r, (te.shape[0] * tm, i), BF16)
  w, up = _stack(r, 3, i, o), (_stack(r, 3, i, o) if swiglu else None)
  got = mosaic.grouped_matmul(x, te, w, up=up, tile_m=tm, interpret=True)
  want = compiled(reference.grouped_matmul)(x, te, w, up=up, tile_m=tm)
  assert got.dtype == BF16 and got.shape == want.shape
  empty = np.repeat(np.asarray(te) < 0, tm)
  assert (f32(got)[empty] == 0).all() and np.isfinite(f32(got)).all()
  assert_close(got, want, BF16)


@pytest.mark.parametrize("fmt,swiglu", [("int8", True), ("fp8", False)])
def test_8bit_stacks_match_reference(request, fmt, swiglu):
  """Converted to bf16 in shared memory, scaled per channel after the sum;
  an empty tile stays zeros."""
  r = rng(request)
  te = jnp.asarray(GROUPS["mixed"], jnp.int32)
  x = normal(r, (te.shape[0] * 64, 128), BF16)
  w = _stack(r, 3, 128, 64, fmt)
  up = _stack(r, 3, 128, 64, fmt) if swiglu else None
  got = mosaic.grouped_matmul(x, te, w, up=up, tile_m=64, interpret=True)
  assert (f32(got)[64:128] == 0).all()
  assert_close(got, compiled(reference.grouped_matmul)(x, te, w, up=up,
                                                      tile_m=64), BF16)


def test_128_row_tiles_and_wide_blocks(request):
  """tile_m 128 (two m64 slices an accumulator), block_n 128, three input
  blocks; the same through the api's 'mosaic_interpret'."""
  r = rng(request)
  te = jnp.asarray([0, -1, 1], jnp.int32)
  x = normal(r, (3 * 128, 192), BF16)
  w = _stack(r, 2, 192, 128)
  got = api.grouped_matmul(x, te, w, tile_m=128,
                           implementation="mosaic_interpret")
  assert_close(got, compiled(reference.grouped_matmul)(x, te, w, tile_m=128),
               BF16)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_overlap_gives_the_same_bits(request, fmt):
  """overlap (a step's wgmmas run on into the next, slots held a step
  longer, 8-bit tiles converted into two alternating buffers): the same
  products in the same order."""
  r = rng(request)
  te = jnp.asarray(GROUPS["mixed"], jnp.int32)
  x = normal(r, (te.shape[0] * 64, 256), BF16)
  w, up = _stack(r, 3, 256, 64, fmt), _stack(r, 3, 256, 64, fmt)
  run = lambda overlap: _bits(mosaic.grouped_matmul(
      x, te, w, up=up, tile_m=64, overlap=overlap, interpret=True))
  np.testing.assert_array_equal(run(True), run(False))


def _tokens(request, t, k=2, n_experts=4, e=128, m=64):
  """x [T, E], expert ids [T, K] (distinct per token), gate/up/down."""
  r = rng(request)
  ids = np.stack([r.permutation(n_experts)[:k] for _ in range(t)])
  stacks = (_stack(r, n_experts, e, m), _stack(r, n_experts, e, m),
            _stack(r, n_experts, m, e))
  return normal(r, (t, e), BF16), jnp.asarray(ids, jnp.int32), stacks


def test_a_tokens_bits_do_not_depend_on_the_tokens_beside_it(request):
  """api.expert_mlp by 'mosaic_interpret': near the reference, and a token
  alone, among others and in another order, the same bits (P and the
  group sizes change, the tiles do not)."""
  x, ids, stacks = _tokens(request, 9)
  run = jax.jit(lambda x, ids: api.expert_mlp(
      x, ids, *stacks, implementation="mosaic_interpret"))
  full = run(x, ids)
  assert_close(full, api.expert_mlp(x, ids, *stacks,
                                    implementation="reference"), BF16)
  np.testing.assert_array_equal(_bits(run(x[4:5], ids[4:5]))[0],
                                _bits(full)[4])
  order = np.random.default_rng(3).permutation(9)
  np.testing.assert_array_equal(_bits(run(x[order], ids[order])),
                                _bits(full)[order])


def test_rows_per_tile_follows_the_routed_rows():
  assert mosaic.rows_per_tile(8 * 32, 256) == 64
  assert mosaic.rows_per_tile(8 * 32 * 1311, 256) == 128


def test_what_it_cannot_take_falls_through_to_triton(request):
  """Per-group scales and float32 rows: NotImplementedError from the
  kernel, the Triton kernel's bits through the api."""
  r = rng(request)
  te = jnp.asarray([0, 1], jnp.int32)
  x = normal(r, (32, 64), BF16)
  grouped = _stack(r, 2, 64, 64, "int8", group=32)
  with pytest.raises(NotImplementedError, match="per-group"):
    mosaic.grouped_matmul(x, te, grouped, tile_m=64, interpret=True)
  with pytest.raises(NotImplementedError, match="bfloat16 only"):
    mosaic.grouped_matmul(x.astype(jnp.float32), te,
                          _stack(r, 2, 64, 64), tile_m=64, interpret=True)
  np.testing.assert_array_equal(
      _bits(api.grouped_matmul(x, te, grouped, tile_m=16,
                               implementation="mosaic_interpret")),
      _bits(api.grouped_matmul(x, te, grouped, tile_m=16,
                               implementation="pallas_interpret")))


def test_bad_tiles_are_not_implemented(request):
  r = rng(request)
  x, te, w = normal(r, (64, 128), BF16), jnp.zeros((1,), jnp.int32), None
  w = _stack(r, 1, 128, 64)
  for kw, msg in [(dict(tile_m=32), "tile_m"), (dict(block_n=32), "block_n"),
                  (dict(block_k=96), "block_k"),
                  (dict(block_n=128), "multiples of")]:
    with pytest.raises(NotImplementedError, match=msg):
      mosaic.grouped_matmul(x, te, w, interpret=True, **{"tile_m": 64, **kw})


def test_mosaic_is_opt_in():
  assert set(api.MOSAIC) <= set(api.IMPLEMENTATIONS)
  assert api.resolve_implementation(None) in ("pallas", "reference")
  assert ops.Kernels().experts_backend == "triton"
  with pytest.raises(ValueError, match="experts_backend"):
    ops.Kernels(experts_backend="cutlass")


S = jax.ShapeDtypeStruct


def _custom_calls(fn, *args):
  text = jax.jit(fn).trace(*args).lower(
      lowering_platforms=("cuda",)).as_text()
  return re.findall(r"custom_call @([\w$.]+)", text)


def _shapes(fmt, x, i, o):
  """A stack's ShapeDtypeStructs in format fmt (per-channel scales)."""
  if fmt == "bf16":
    return (S((x, i, o), BF16),)
  return S((x, o, i), FORMATS[fmt]), S((x, o, 1), jnp.float32)


@pytest.mark.parametrize("tile_m,fmt,overlap", [
    (64, "bf16", False), (128, "bf16", True), (64, "int8", True),
    (128, "int8", False), (64, "fp8", False), (128, "fp8", True)])
def test_lowers_for_cuda_at_llada2_mini_expert_shapes(tile_m, fmt, overlap):
  """Gate/up fused and down (256 experts, 2048 wide, 512 an expert) over
  412 row tiles: Mosaic GPU's lowering (wgmma operand swizzles and
  transposes, TMA tiles, register layouts) on the CPU, one mosaic_gpu
  custom call each."""
  p, x, e, m = 412 * 64, 256, 2048, 512

  def run(rows, te, gate, up, down):
    h = mosaic.grouped_matmul(rows, te, gate, up=up, tile_m=tile_m,
                              overlap=overlap)
    return mosaic.grouped_matmul(h, te, down, tile_m=tile_m, overlap=overlap)

  args = (S((p, e), BF16), S((p // tile_m,), jnp.int32),
          _shapes(fmt, x, e, m), _shapes(fmt, x, e, m), _shapes(fmt, x, m, e))
  assert _custom_calls(run, *args) == ["mosaic_gpu_v2"] * 2


def test_kernels_experts_backend_mosaic_runs_the_mosaic_kernel():
  """ops.routed_experts under Kernels("pallas", experts_backend="mosaic")
  lowers to Mosaic GPU's two calls, not Triton's."""
  t, k, x, e, m = 32, 8, 256, 2048, 512
  stacks = ((S((x, e, m), BF16),), (S((x, e, m), BF16),),
            (S((x, m, e), BF16),))
  kernels = ops.Kernels("pallas", experts_backend="mosaic")
  run = lambda h, ids, stacks: ops.routed_experts(h, ids, 0, stacks,
                                                  implementation=kernels)
  calls = _custom_calls(run, S((t, e), BF16), S((t, k), jnp.int32), stacks)
  assert calls == ["mosaic_gpu_v2"] * 2, calls


@gpu_only
@pytest.mark.parametrize("overlap", [False, True], ids=["wait", "overlap"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("tile_m", mosaic.ROW_TILES)
def test_gpu_matches_reference_at_expert_shapes(request, tile_m, fmt,
                                                overlap):
  r = rng(request)
  n_experts, e, m, n_tiles = 8, 2048, 512, 12
  te = jnp.asarray(r.integers(-1, n_experts, n_tiles), jnp.int32)
  x = normal(r, (n_tiles * tile_m, e), BF16)
  gate = _stack(r, n_experts, e, m, fmt)
  up = _stack(r, n_experts, e, m, fmt)
  down = _stack(r, n_experts, m, e, fmt)
  h = mosaic.grouped_matmul(x, te, gate, up=up, tile_m=tile_m,
                            overlap=overlap)
  assert_close(h, reference.grouped_matmul(x, te, gate, up=up,
                                           tile_m=tile_m), BF16)
  y = mosaic.grouped_matmul(h, te, down, tile_m=tile_m, overlap=overlap)
  assert_close(y, reference.grouped_matmul(h, te, down, tile_m=tile_m), BF16)
  assert (f32(y)[np.repeat(np.asarray(te) < 0, tile_m)] == 0).all()


def _mlp(x, ids, stacks, tile_m, overlap=False):
  """expert_mlp's sort, products and scatter at a given tile_m."""
  dest, tiles = layout.sort_pairs(ids.reshape(-1), stacks[0][0].shape[0],
                                  tile_m)
  p = tiles.shape[0] * tile_m
  rows = layout.gather_rows(x, dest, ids.shape[1], p)
  h = mosaic.grouped_matmul(rows, tiles, stacks[0], up=stacks[1],
                            tile_m=tile_m, overlap=overlap)
  return layout.scatter_back(mosaic.grouped_matmul(
      h, tiles, stacks[2], tile_m=tile_m, overlap=overlap), dest)


@gpu_only
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_rows_do_not_depend_on_the_rows_beside_them_or_the_tile(
    request, fmt):
  """A token alone and among 300 others, at 64- and 128-row tiles, with
  and without the overlap: the same bits (rows_per_tile may pick either
  tile for a batch)."""
  r = rng(request)
  t, k, e, m, n_experts = 300, 8, 2048, 512, 64
  x = normal(r, (t, e), BF16)
  ids = jnp.asarray(np.stack([r.permutation(n_experts)[:k]
                              for _ in range(t)]), jnp.int32)
  stacks = tuple(_stack(r, n_experts, i, o, fmt)
                 for i, o in ((e, m), (e, m), (m, e)))
  run = jax.jit(_mlp, static_argnums=(3, 4))
  full = _bits(run(x, ids, stacks, 64))
  np.testing.assert_array_equal(_bits(run(x, ids, stacks, 128)), full)
  np.testing.assert_array_equal(_bits(run(x, ids, stacks, 128, True)), full)
  for row in (0, 137, 299):
    np.testing.assert_array_equal(
        _bits(run(x[row:row + 1], ids[row:row + 1], stacks, 64)),
        full[row * k:(row + 1) * k])
