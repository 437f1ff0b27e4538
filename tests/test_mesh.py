"""Device meshes on forced host devices: data and tensor parallelism give the
one-device tokens for every strategy, the kernels run per shard and
loading puts each weight straight onto its shards (the mesh specs, the
distributed setup and the mesh entry points are in test_mesh_setup.py).

Exactness: no float sum crosses devices (parallel.py), so a forward under
any mesh gives the one-device bits; tests/test_mesh_exact.py checks that
for every forward and the compiled collectives. The forwards compared here
run under STRICT_CPU.
"""

import pytest

from tests.mesh_case import MESHES, STRICT_CPU, run_parts


STRATEGIES = r'''
import sys, time
from flash_dllm_jax import sampling
from flash_dllm_jax.sampling import FastDLLMSampler
from flash_dllm_jax.architectures.dream.sampler import DreamSampler
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
meshes = sys.argv[1].split(";")
flash = dict(gen_length=16, block_m=4, track_num=2, mask_num=2)
cases = [
  ("llada", LLaDASampler(gen_length=16, steps=8, block_length=8)),
  ("llada", LLaDASampler(gen_length=16, steps=16, temperature=0.7)),
  ("dream", DreamSampler(gen_length=16, steps=8, alg="entropy")),
  ("llada", FastDLLMSampler(gen_length=16, block_length=8, cache="none")),
  ("dream", FastDLLMSampler(gen_length=16, block_length=8, cache="prefix")),
  ("llada", FastDLLMSampler(gen_length=16, block_length=8, cache="dual")),
  ("dream", FlashDLLMSampler(**flash, threshold=0.6)),
  ("llada", FlashDLLMSampler(**flash, threshold=0.9, verify=True, gamma=0.4)),
]
cases.append(("llada", sampling.ElasticCacheSampler(
    gen_length=16, window=4, track_num=1, gamma=0.9)))
from flash_dllm_jax.sampling.flash_dllm_onepass import FlashDLLMOnePassSampler
cases.append(("dream", FlashDLLMOnePassSampler(**flash, threshold=0.9,
                                               gamma=0.4)))
prompts = random_prompts(50, [4, 13, 9, 30, 6])  # 5 rows: padded to 6 or 8
models = {arch: tiny4(arch) for arch in ("llada", "dream")}
# Every case runs on data=2,model=2 (rows, a padding row and weights split,
# so every sampler class runs on a split model); an uncached case and the
# cached verify case (MODEL_FOUR) also on model=4, and the first also on
# pure data parallelism (data=4): the samplers' state is split by rows only
# (no sampler code reads the mesh), and the uncached, cached and verify
# forwards are bitwise one device's under model=4 (tests/test_mesh_exact.py).
MODEL_FOUR = {0, 7}
DATA_ONLY = {0}
for i, (arch, sampler) in enumerate(cases):
  t0 = time.time()
  config, params = models[arch]
  one = generate(params, prompts, config=config, sampler=sampler, seed=5)
  for spec in meshes:
    if (spec == "data=1,model=4" and i not in MODEL_FOUR
        or spec == "data=4,model=1" and i not in DATA_ONLY):
      continue
    out = generate(params, prompts, config=config, sampler=sampler, seed=5,
                   mesh=spec)
    where = f"{type(sampler).__name__} {arch} {spec}"
    np.testing.assert_array_equal(out.tokens_BxG, one.tokens_BxG, where)
    np.testing.assert_array_equal(out.forwards_B, one.forwards_B, where)
    np.testing.assert_array_equal(out.steps_B, one.steps_B, where)
  print(f"{type(sampler).__name__} {arch}: {time.time() - t0:.1f} s",
        flush=True)
print("MESH-OK", len(cases))
'''


def test_every_strategy_gives_the_one_device_tokens_on_every_mesh(strict):
  """Each sampler configuration on data=2,model=2, an uncached and the
  cached verify one also on model=4, and LLaDA's also on pure data
  parallelism (data=4)."""
  out = strict["strategies"]
  assert out.endswith("PASSED") and "MESH-OK 10" in out, out


KERNELS = r'''
import sys
from flash_dllm_jax.model import CachedExtras

# 1. A cached forward through the Pallas kernels (interpreted) under each
# mesh: kernels (norms included) per shard via shard_map, caches sharded
# along heads, and the one-device logits, caches and mass, bit for bit.
config, params = tiny4("llada", head_dim=32, n_layers=1)
rng = np.random.default_rng(0)
B, S, Q = 4, 32, 8
cache, tokens, slots, valid = cached_inputs(config, rng, B, S, Q,
                                            jnp.float32)
extras = CachedExtras(mass_rows_BxQ=jnp.asarray(rng.random((B, Q)) > 0.3))

def forward(p, tokens, slots, valid, cache):
  (logits, new), state = Transformer(
      config, implementation="pallas_interpret").apply(
          {"params": p}, tokens, slots, valid, cache=cache, slots_BxQ=slots,
          extras=extras, mutable=["intermediates"])
  return logits, new, sum(jax.tree.leaves(state))

ref = jax.jit(forward)(params, tokens, slots, valid, cache)
mapped = []
real_map = parallel.shard_map
parallel.shard_map = lambda fn, *a: mapped.append(fn) or real_map(fn, *a)
for spec in sys.argv[1].split(";"):
  mesh = parallel.parse_mesh(spec)
  args = [parallel.shard_params(mesh, config, params)]
  args += [parallel.shard_rows(mesh, a) for a in (tokens, slots, valid)]
  mapped.clear()
  with parallel.use(mesh):
    out = jax.jit(forward)(*args, cache)
  # rope + cache write, attention, and the three norms of one layer's model
  names = sorted(fn.__qualname__.split(".")[0] for fn in mapped)
  assert names == ["cached_attention", "rms_norm", "rms_norm", "rms_norm",
                   "rope_and_write"], (spec, names)
  np.testing.assert_array_equal(out[0], ref[0], spec)
  np.testing.assert_array_equal(out[2], ref[2], spec)
  for a, b in zip(jax.tree.leaves(out[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_array_equal(a, b)
    assert a.sharding.is_equivalent_to(jax.sharding.NamedSharding(
        mesh, parallel.CACHE_SPEC), a.ndim), (spec, a.sharding)
parallel.shard_map = real_map
print("KERNELS-OK")
'''


LOADING = r'''
import tempfile
from pathlib import Path
from flash_dllm_jax import checkpoint
from flash_dllm_jax.architectures.llada.sampler import LLaDASampler

# 2. Loading straight onto shards: every host-to-device transfer carries one
# shard, never a whole sharded weight, and decoding the loaded model gives
# the tokens of the unsharded load (the first strategies case's sampler and
# prompts: its programs, compiled by that part, run here).
config, params = tiny4("llada")
tmp = Path(tempfile.mkdtemp()) / "ckpt"
checkpoint.save(tmp, params, config)
flat = {"/".join(k.key for k in path): x for path, x in
        jax.tree_util.tree_flatten_with_path(params)[0]}
puts = []
real_put = jax.device_put
def spy(x, *a, **k):
  puts.append(np.array(x))
  return real_put(x, *a, **k)
sampler = LLaDASampler(gen_length=16, steps=8, block_length=8)
prompts = random_prompts(50, [4, 13, 9, 30, 6])
base = generate(checkpoint.load(tmp)[0], prompts, config=config,
                sampler=sampler)
for spec in ["data=1,model=4", "data=2,model=2"]:
  mesh = parallel.parse_mesh(spec)
  m = parallel.model_size(mesh)
  puts.clear()
  jax.device_put = spy
  try:
    loaded, _, _ = checkpoint.load(tmp, mesh=mesh)
  finally:
    jax.device_put = real_put
  assert puts, "orbax did not go through jax.device_put"
  got = {"/".join(k.key for k in path): x for path, x in
         jax.tree_util.tree_flatten_with_path(loaded)[0]}
  sharded = 0
  for path, x in got.items():
    want = parallel.param_spec(config, path, x.shape, mesh)
    assert x.sharding.spec == want, (path, x.sharding.spec, want)
    np.testing.assert_array_equal(x, flat[path])
    shard = list(x.shape)
    for dim, axis in enumerate(want):
      if axis == "model":
        shard[dim] //= m
    if "model" in tuple(want):
      sharded += 1
      assert tuple(shard) != x.shape, path
      assert {s.data.shape for s in x.addressable_shards} == {tuple(shard)}
      assert not any(y.shape == x.shape and np.array_equal(y, flat[path])
                     for y in puts), (path, "whole weight transferred")
  assert sharded == 1 + 7 * config.n_layers, sharded
  out = generate(loaded, prompts, config=config, sampler=sampler, mesh=mesh)
  np.testing.assert_array_equal(out.tokens_BxG, base.tokens_BxG)
print("LOADING-OK")

# 3. A model whose heads the mesh cannot split: a clear error.
try:
  generate(params, prompts, config=ModelConfig.tiny("llada"),
           sampler=sampler, mesh="model=4")
  raise AssertionError("model=4 with 2 KV heads was accepted")
except ValueError as e:
  assert "n_kv_heads=2" in str(e), e
print("ERRORS-OK")
'''


def test_kernels_per_shard_and_loading_onto_shards(strict):
  out = strict["kernels"]
  assert out.endswith("PASSED") and "KERNELS-OK" in out, out
  out = strict["loading"]
  assert out.endswith("PASSED"), out
  for tag in ("LOADING-OK", "ERRORS-OK"):
    assert tag in out, out


FUSED_ATTENTION = r'''
import jax, jax.numpy as jnp, numpy as np
from flash_dllm_jax import ops, parallel
ks = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(ks[0], (4, 12, 8, 64), jnp.float32)
k = jax.random.normal(ks[1], (4, 12, 4, 64), jnp.float32)
v = jax.random.normal(ks[2], (4, 12, 4, 64), jnp.float32)
valid = jnp.arange(12)[None, :] >= jnp.array([0, 3, 7, 12])[:, None]
run = jax.jit(lambda *a: ops.attention(*a, scale=0.125,
                                       implementation="pallas"))
alone = run(q, k, v, valid)
ref = ops.attention(q, k, v, valid, scale=0.125, implementation="reference")
np.testing.assert_allclose(alone, ref, atol=1e-5, rtol=1e-5)
for spec in ["data=1,model=4", "data=2,model=2", "data=4,model=1"]:
  mesh = parallel.parse_mesh(spec)
  with parallel.use(mesh):
    text = jax.jit(lambda *a: ops.attention(
        *a, scale=0.125, implementation="pallas")).lower(
            q, k, v, valid).as_text()
    got = run(q, k, v, valid)
  assert ("sdy.manual_computation" in text
          or "SPMDFullToShardShape" in text), (spec, "not run per shard")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(alone), spec)
print("FUSED-OK")
'''


def test_fused_attention_runs_per_shard_and_ignores_the_mesh(strict):
  """The GPU attention path (forced here; XLA's composition on CPU) runs per
  shard under every mesh (rows on data, heads on model: no sum crosses
  shards) and gives the one-device bits."""
  out = strict["fused attention"]
  assert out.endswith("PASSED") and "FUSED-OK" in out, out


def test_linear_asks_for_bf16_products_only_on_a_gpu_without_model_shards(
    strict):
  """ops.linear's direct bf16 product (cuBLAS: float32 accumulation, one
  rounding) is for GPUs, and not under tensor parallelism; CPUs and model
  shards keep the float32 product and a cast."""
  out = strict["linear"]
  assert out.endswith("ok\nPASSED"), out


LINEAR = r'''
from flash_dllm_jax import ops
x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16)

def product_dtypes(bias=None):
  jaxpr = jax.jit(lambda x, w: ops.linear(x, w, bias)).trace(x, w).jaxpr
  return [str(e.params["preferred_element_type"]) for e in jaxpr.eqns
          if e.primitive.name == "dot_general"]

seen = {"cpu": product_dtypes()}
jax.default_backend = lambda: "gpu"  # what ops.linear asks; runs on CPU
seen["gpu"] = product_dtypes()
seen["gpu bias"] = product_dtypes(jnp.zeros((16,), jnp.bfloat16))
for spec in ("data=4", "data=2,model=2", "model=4"):
  with parallel.use(parallel.parse_mesh(spec)):
    seen["gpu " + spec] = product_dtypes()
assert seen == {"cpu": ["float32"], "gpu": ["bfloat16"],
                "gpu bias": ["float32"], "gpu data=4": ["bfloat16"],
                "gpu data=2,model=2": ["float32"],
                "gpu model=4": ["float32"]}, seen
print("ok")
'''


# One interpreter for the module's scripts (a Python with JAX imported costs
# seconds), under STRICT_CPU for the bitwise forwards (the decodes compare
# tokens, which these flags only make more certain); loading decodes the
# programs the strategies part compiled; the jaxpr check comes last: it
# fakes a GPU backend (and traces only, so the flags do not matter).
@pytest.fixture(scope="module")
def strict():
  return run_parts({"strategies": STRATEGIES,
                    "fused attention": FUSED_ATTENTION,
                    "kernels": KERNELS,
                    "loading": LOADING,
                    "linear": LINEAR}, ";".join(MESHES),
                   xla_flags=STRICT_CPU)
