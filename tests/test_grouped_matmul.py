"""The grouped GEMM (pallas_kernels/grouped_matmul) against its reference,
the sort/pad/gather glue, and the MoE layer through the grouped path
against moe.dense_reference, with a token's bits independent of the
tokens routed beside it.

CPU runs the kernel in Pallas interpret mode (whose outputs start as NaN,
so an unwritten tile fails); GPU-marked tests run Triton (run them with
JAX_PLATFORMS=cuda).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_jax import ops
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import init_params, moe
from flash_dllm_jax.ops import experts
from pallas_kernels.grouped_matmul import api, kernel, layout, reference
from pallas_kernels.qmatmul.reference import FP8, quantize
from tests.kernel_case import (IMPLS, assert_close, compiled, f32, gpu_only,
                               normal, rng)
from tests.mesh_case import STRICT_CPU, run_script

TILE = 16


def _tiles(r, n_tiles, n_experts):
  """tile_expert: every expert at least once, some tiles empty (-1)."""
  te = r.integers(-1, n_experts, n_tiles)
  te[:n_experts] = np.arange(n_experts)
  return jnp.asarray(te, jnp.int32)


def _weight(r, x, i, o, dtype, fmt):
  """(kernel [X, I, O],) or the 8-bit (kernel_q [X, O, I], scale)."""
  w = r.standard_normal((x, i, o)) * i ** -0.5
  if fmt is None:
    return (normal(r, (x, i, o), dtype, i ** -0.5),)
  qdtype, group = fmt
  qs = [quantize(jnp.asarray(w[e].T, jnp.float32), qdtype, group)
        for e in range(x)]
  return (jnp.stack([q for q, _ in qs]), jnp.stack([s for _, s in qs]))


FORMATS = {"bf16": None, "int8": (jnp.int8, None), "fp8": (FP8, None),
           "int8_g32": (jnp.int8, 32)}
# (weight format, row dtype, SwiGLU): 8-bit weights meet bf16 rows.
CASES = [("bf16", jnp.float32, False), ("bf16", jnp.float32, True),
         ("bf16", jnp.bfloat16, False), ("bf16", jnp.bfloat16, True),
         ("int8", jnp.bfloat16, True), ("fp8", jnp.bfloat16, False),
         ("int8_g32", jnp.bfloat16, True)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt,dtype,swiglu", CASES,
                         ids=lambda c: getattr(c, "__name__", str(c)))
def test_matches_reference(request, fmt, dtype, swiglu, impl):
  r = rng(request)
  n_experts, i, o, n_tiles = 3, 64, 32, 6
  x = normal(r, (n_tiles * TILE, i), dtype)
  te = _tiles(r, n_tiles, n_experts)
  w = _weight(r, n_experts, i, o, dtype, FORMATS[fmt])
  up = _weight(r, n_experts, i, o, dtype, FORMATS[fmt]) if swiglu else None
  got = api.grouped_matmul(x, te, w, up=up, tile_m=TILE, implementation=impl,
                           block_n=16, block_k=32)
  want = compiled(reference.grouped_matmul)(x, te, w, up=up, tile_m=TILE)
  assert got.dtype == dtype and got.shape == (n_tiles * TILE, o)
  got = f32(got)
  assert np.isfinite(got).all()
  empty = np.repeat(np.asarray(te) < 0, TILE)
  assert (got[empty] == 0).all()
  assert_close(got, want, dtype)


def test_tiling_is_validated():
  with pytest.raises(ValueError, match="tile_m must be a power of two"):
    ops.ExpertTiling(tile_m=24)
  with pytest.raises(ValueError, match="num_stages"):
    ops.ExpertTiling(num_stages=0)


def test_unsupported_shapes_raise(request):
  r = rng(request)
  x = normal(r, (32, 24), jnp.float32)  # no power-of-two tile >= 16 of 24
  te = jnp.zeros((2,), jnp.int32)
  with pytest.raises(NotImplementedError):
    kernel.grouped_matmul(x, te, (normal(r, (1, 24, 32)),), tile_m=16,
                          interpret=True)
  with pytest.raises(NotImplementedError):
    kernel.grouped_matmul(x[:24], te, (normal(r, (1, 24, 32)),), tile_m=16,
                          interpret=True)


def test_widths_the_kernel_does_not_take_run_dense(request):
  """Model width 24 (no power-of-two tile >= 16): ops.routed_experts takes
  the dense path, the same bits."""
  r = rng(request)
  x, ids = normal(r, (5, 24)), jnp.asarray(r.integers(0, 3, (5, 2)),
                                           jnp.int32)
  stacks = tuple((normal(r, (3, i, o)),) for i, o in ((24, 32), (24, 32),
                                                      (32, 24)))
  got = ops.routed_experts(x, ids, 0, stacks,
                           implementation="pallas_interpret")
  np.testing.assert_array_equal(
      f32(got), f32(experts.dense_experts(x, ids, 0, stacks)))


@pytest.mark.parametrize("n_pairs,n_experts,tile_m",
                         [(20, 4, 16), (7, 8, 16), (300, 5, 32)])
def test_sort_pairs_gives_each_tile_one_expert(n_pairs, n_experts, tile_m):
  r = np.random.default_rng(n_pairs)
  # -1 and n_experts: pairs of experts held elsewhere
  expert = r.integers(-1, n_experts + 1, n_pairs)
  dest, tiles = map(np.asarray, layout.sort_pairs(
      jnp.asarray(expert, jnp.int32), n_experts, tile_m))
  p = layout.padded_rows(n_pairs, n_experts, tile_m)
  assert tiles.shape == (p // tile_m,)
  local = (expert >= 0) & (expert < n_experts)
  assert (dest[~local] == p).all()
  assert len(set(dest[local])) == local.sum() and (dest[local] < p).all()
  assert (tiles[dest[local] // tile_m] == expert[local]).all()
  for e in range(n_experts):  # stable: in pair order within an expert
    rows = dest[expert == e]
    assert (np.diff(rows) > 0).all()
  used = np.zeros(p // tile_m, bool)
  used[dest[local] // tile_m] = True
  assert (tiles[~used] == -1).all()


def _layer(config):
  params = init_params(config, jax.random.key(1))["layers_1"]["moe"]
  # a decisive router and a non-zero bias, so that groups and bias matter
  bias = np.random.default_rng(0).normal(0, 0.1, config.moe.n_experts)
  return {**params, "router": params["router"] * 40.0,
          "expert_bias": jnp.asarray(bias, jnp.float32)}


def _apply(config, params, n_BxQxE, impl="pallas_interpret"):
  layer = moe.MoE(config, jnp.float32, implementation=impl)
  return layer.apply({"params": params}, n_BxQxE, jnp.zeros_like(n_BxQxE))


ROWS_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import moe
from tests.kernel_case import f32
from tests.test_grouped_matmul import _apply, _layer
config = ModelConfig.tiny("llada2")
params = _layer(config)
n = jnp.asarray(np.random.default_rng(1).normal(size=(3, 7, 64)), jnp.float32)
run = jax.jit(lambda p, x: _apply(config, p, x))
full = f32(run(params, n))
want = moe.dense_reference(params, config, n)
np.testing.assert_allclose(full, np.asarray(want), rtol=2e-5, atol=2e-5)
np.testing.assert_array_equal(full[1:2, 4:5], f32(run(params, n[1:2, 4:5])))
order = np.random.default_rng(3).permutation(7)
np.testing.assert_array_equal(f32(run(params, n[::-1, order])),
                              full[::-1, order])
print("ROWS-OK")
"""


def test_grouped_layer_equals_the_dense_reference_row_by_row():
  """Near the float32 reference, and bit for bit a token's alone, among
  others and in another order (the padded row count P changes with them,
  the tiles do not). At XLA's default flags, as users compile it: the
  suite's optimisation level 0 sums a row's products in an order that
  depends on the row count."""
  assert "ROWS-OK" in run_script(ROWS_SCRIPT, devices=1, quick=False)


MESH_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from tests.test_grouped_matmul import _apply, _layer
config = ModelConfig.tiny("llada2")
params = _layer(config)
n = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 64)), jnp.float32)
run = jax.jit(lambda p, x: _apply(config, p, x))
one = np.asarray(run(params, n))
with parallel.use(parallel.parse_mesh("data=2,model=2")):
  split = np.asarray(run(params, n))
np.testing.assert_array_equal(split, one)
print("MESH-OK")
"""


def test_grouped_experts_split_over_a_mesh_give_one_devices_bits():
  """data=2,model=2: each device sorts its rows' pairs for its 4 experts,
  the others' pairs are -0.0, and the psum gives one device's bits."""
  assert "MESH-OK" in run_script(MESH_SCRIPT, xla_flags=STRICT_CPU)


def test_pairs_of_other_devices_experts_are_negative_zero(request):
  """An expert shard (experts 4 .. 7 of 8), tiled by a Kernels' settings:
  its pairs match the dense path, the other pairs are -0.0 (what the psum
  over "model" relies on)."""
  r = rng(request)
  t, k, e, m = 9, 2, 64, 32
  x = normal(r, (t, e))
  ids = jnp.asarray(r.integers(0, 8, (t, k)), jnp.int32)
  stacks = tuple((normal(r, (4, i, o), scale=i ** -0.5),)
                 for i, o in ((e, m), (e, m), (m, e)))
  kernels = ops.Kernels("pallas_interpret", experts=ops.ExpertTiling(
      tile_m=16, block_n=16, block_k=16, num_stages=1))
  got = f32(ops.routed_experts(x, ids, 4, stacks, others=True,
                               implementation=kernels))
  want = f32(experts.dense_experts(x, ids, 4, stacks, others=True))
  mine = np.asarray(ids) >= 4
  assert (got[~mine] == 0).all() and np.signbit(got[~mine]).all()
  assert_close(got, want, jnp.float32)


@gpu_only
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_triton_matches_reference_at_expert_shapes(request, fmt):
  r = rng(request)
  n_experts, i, o, n_tiles = 8, 2048, 512, 24
  x = normal(r, (n_tiles * 64, i), jnp.bfloat16)
  te = _tiles(r, n_tiles, n_experts)
  w = _weight(r, n_experts, i, o, jnp.bfloat16, FORMATS[fmt])
  u = _weight(r, n_experts, i, o, jnp.bfloat16, FORMATS[fmt])
  got = api.grouped_matmul(x, te, w, up=u, implementation="pallas")
  want = reference.grouped_matmul(x, te, w, up=u, tile_m=64)
  assert_close(got, want, jnp.bfloat16)


@gpu_only
def test_triton_rows_do_not_depend_on_the_rows_beside_them(request):
  """ops.routed_experts on the GPU: a token alone and among 300 others,
  the same bits."""
  r = rng(request)
  t, k, e, m, n_experts = 300, 8, 2048, 512, 64
  x = normal(r, (t, e), jnp.bfloat16)
  ids = jnp.asarray(np.stack([r.permutation(n_experts)[:k]
                              for _ in range(t)]), jnp.int32)
  stacks = tuple((normal(r, (n_experts, i, o), jnp.bfloat16, i ** -0.5),)
                 for i, o in ((e, m), (e, m), (m, e)))
  run = jax.jit(lambda x, ids: ops.routed_experts(x, ids, 0, stacks,
                                                  implementation="pallas"))
  full = f32(run(x, ids))
  for row in (0, 137, 299):
    np.testing.assert_array_equal(f32(run(x[row:row + 1],
                                          ids[row:row + 1]))[0], full[row])
  # Both round h to bf16 between the products, at different points of
  # their float32 sums: near-zero outputs may differ by a bf16 ulp of h.
  dense = f32(experts.dense_experts(x, ids, 0, stacks))
  assert np.linalg.norm(full - dense) / np.linalg.norm(dense) < 1e-2
