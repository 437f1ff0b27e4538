"""8-bit weights under tensor parallelism give one device's bits (forced
host devices): kernel_q and scale are sharded with their output columns,
attn_out and down gather their input and output, the LM head (with
quantize_head) is replicated, and the 8-bit embedding (with
quantize_embedding) is sharded along the vocabulary like a bf16 one."""

import pytest

from tests.mesh_case import STRICT_CPU, run_parts

SCRIPT = r'''
from flash_dllm_jax import quantize
from flash_dllm_jax.model import CachedExtras
fmt, arch, impl, dtype, embedding = ARGS
config, params = tiny4(arch, d_model=128, head_dim=16, dtype=dtype)
config = config.replace(quantize=fmt, quantize_head=True,
                        quantize_embedding=embedding)
params = quantize.quantize_params(params, config)
model = Transformer(config, implementation=impl)
rng = np.random.default_rng(0)
B, S, Q = 4, 64, 8
cache, tokens, slots, valid = cached_inputs(config, rng, B, S, Q, dtype)

def cached(p):
  return model.apply({"params": p}, tokens, slots, valid, cache=cache,
                     slots_BxQ=slots, extras=CachedExtras())

def uncached(p):
  full = tokens.repeat(3, axis=1)
  positions = jnp.broadcast_to(jnp.arange(full.shape[1]), full.shape)
  return model.apply({"params": p}, full, positions,
                     jnp.ones(full.shape, bool))[0]

for name, fn in (("cached", cached), ("uncached", uncached)):
  one = jax.jit(fn)(params)
  for spec in ("data=2,model=2",):  # model=2's shards, rows split too
    mesh = parallel.parse_mesh(spec)
    sharded = parallel.shard_params(mesh, config, params)
    q = sharded["layers_0"]["q_proj"]
    assert q["kernel_q"].sharding.spec == jax.sharding.PartitionSpec(
        "model", None), q["kernel_q"].sharding
    assert q["scale"].sharding.spec == q["kernel_q"].sharding.spec
    if embedding:
      for e in sharded["embed"].values():
        assert e.sharding.spec == q["kernel_q"].sharding.spec, e.sharding
    with parallel.use(mesh):
      got = jax.jit(fn)(sharded)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(one), strict=True):
      np.testing.assert_array_equal(a, b, f"{fmt} {impl} {name} {spec}")
print("QUANT-MESH-OK")
'''


CASES = [("fp8", "llada", "pallas_interpret", "bfloat16", True),
         ("fp8", "dream", "reference", "float32", False),
         ("int8", "dream", "pallas_interpret", "float32", False),
         ("int8-g128", "llada", "reference", "bfloat16", False)]


@pytest.fixture(scope="module")
def outputs():
  """Every case's output, and the load's, from one interpreter (one JAX
  import, not five)."""
  return run_parts({**{str(case): f"ARGS = {case!r}\n" + SCRIPT
                       for case in CASES}, "load": LOAD},
                   xla_flags=STRICT_CPU)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch,impl,dtype,embedding", CASES)
def test_quantized_mesh_forward_is_bitwise_the_one_device_forward(
    fmt, arch, impl, dtype, embedding, outputs):
  """Cached and uncached logits (and caches) with every projection and the
  LM head (in one case the embedding too) quantized: data=2,model=2 (the
  shards of model=2, on half the rows each) equals one device bit for bit, through XLA's partitioning
  ('reference') and through the kernels' shard_map ('pallas_interpret')."""
  # STRICT_CPU for both dtypes: the reference's products are float32 (of
  # dequantized weights) whatever the activations' dtype, and XLA:CPU's
  # default float32 GEMM sums column shards in another order (mesh_case).
  out = outputs[str((fmt, arch, impl, dtype, embedding))]
  assert out.endswith("PASSED") and "QUANT-MESH-OK" in out, out


LOAD = r'''
import sys, tempfile
import jax, numpy as np
from flash_dllm_jax import checkpoint, quantize
from flash_dllm_jax.convert import convert_checkpoint
from tests import hf_fixtures
d = tempfile.mkdtemp()
src, _ = hf_fixtures.write_llada(d + "/hf")
convert_checkpoint(src, d + "/bf16", progress=False)
asked = dict(quantize="fp8", quantize_head=True, quantize_embedding=True)
one, _, _ = checkpoint.load(d + "/bf16", **asked)
for path in (d + "/hf", d + "/bf16"):
  got, config, _ = checkpoint.load(path, mesh="model=2", **asked)
  assert config.quantize == "fp8" and config.quantize_embedding
  q = got["layers_0"]["q_proj"]
  rows = jax.sharding.PartitionSpec("model", None)
  assert q["kernel_q"].sharding.spec == rows, q["kernel_q"].sharding
  assert q["scale"].sharding.spec == rows
  assert got["lm_head"]["kernel_q"].sharding.is_fully_replicated
  for e in got["embed"].values():  # kernel_q [V, E], scale [V, 1]
    assert e.sharding.spec == rows, e.sharding
  a, b = quantize._flatten(one), quantize._flatten(got)
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(np.asarray(a[k]).view(np.uint8),
                          np.asarray(b[k]).view(np.uint8)), k
print("LOAD-OK")
'''


@pytest.mark.slow
def test_load_quantize_onto_a_mesh_shards_kernel_q_and_scale_by_columns(
    outputs):
  """load(mesh='model=2', quantize=) of an HF dir and of an orbax copy:
  kernel_q and scale sharded along their rows (the output columns), the
  quantized LM head replicated, the quantized embedding sharded along the
  vocabulary, the bits those of one device's load."""
  out = outputs["load"]
  assert out.endswith("PASSED") and "LOAD-OK" in out, out
