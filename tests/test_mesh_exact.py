"""Tensor parallelism gives one device's bits (forced host devices).

Every projection is column-sharded and attn_out / down_proj gather their
input and output, the attention kernel takes the key splits of the global
head count, and the attention mass is summed per head, gathered and summed
over heads in one fixed order: no float sum crosses devices. Checked on the
forwards' bits and on the compiled program's collectives.
"""

import json

import pytest

from tests.mesh_case import STRICT_CPU, run_parts


BITWISE = r'''
from pallas_kernels.attention.api import Tiling
from flash_dllm_jax.model import CachedExtras
from flash_dllm_jax.ops import Kernels
arch, impls, dtype, meshes, fused, turn = ARGS

def check(model, impl, turn):
  """Cached, verify and uncached forwards of `model`, each on one mesh of
  `meshes` in turn, starting at meshes[turn]."""
  rng = np.random.default_rng(0)
  B, S, Q = 4, 512, 8
  cache, tokens, slots, valid = cached_inputs(config, rng, B, S, Q, dtype)
  rows = jnp.asarray(rng.random((B, Q)) > 0.3)
  verify = CachedExtras(
      write_cache=False, mass_rows_BxQ=rows,
      exclude_BxS=jnp.asarray(rng.random((B, S)) > 0.9),
      inq_mask_BxQxQ=jnp.asarray(rng.random((B, Q, Q)) > 0.5))

  def cached(p, tokens, slots, valid, cache, extras):
    (logits, new), state = model.apply(
        {"params": p}, tokens, slots, valid, cache=cache, slots_BxQ=slots,
        extras=extras, mutable=["intermediates"])
    return logits, new, state["intermediates"]

  def uncached(p, tokens, valid):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return model.apply({"params": p}, tokens, positions, valid)[0]

  full = jnp.asarray(rng.integers(0, 300, (B, 24)), jnp.int32)
  left_pad = jnp.arange(24)[None, :] >= jnp.array([0, 5, 11, 2])[:, None]
  cases = {"cached": (cached, (tokens, slots, valid, cache,
                               CachedExtras(mass_rows_BxQ=rows))),
           "verify": (cached, (tokens, slots, valid, cache, verify)),
           "uncached": (uncached, (full, left_pad))}
  for i, (name, (fn, args)) in enumerate(cases.items()):
    one = jax.jit(fn)(params, *args)
    leaves = jax.tree.leaves(one)
    assert name == "uncached" or len(jax.tree.leaves(one[2])) == 2, one[2]
    spec = meshes[(turn + i) % len(meshes)]
    mesh = parallel.parse_mesh(spec)
    with parallel.use(mesh):
      got = jax.jit(fn)(parallel.shard_params(mesh, config, params), *args)
    for a, b in zip(jax.tree.leaves(got), leaves, strict=True):
      np.testing.assert_array_equal(a, b, f"{arch} {impl} {name} {spec}")
    print("EQUAL", impl, name, spec, flush=True)

# Few programs per sequence: one device picks 1 key split for its 4 KV
# heads, a shard of 2 or 1 heads would pick 2 if it chose from its own.
config, params = tiny4(arch, head_dim=16, dtype=dtype, fused_qkv=fused)
for i, impl in enumerate(impls):
  check(Transformer(config, implementation=Kernels(
      impl, attention=Tiling(split_target=4))), impl, turn + i)
print("BITWISE-OK")
'''


# bfloat16, the dtype the GPU runs, under XLA:CPU's default flags; float32
# under STRICT_CPU: the strict check, as bfloat16 rounding hides most
# reorderings of a float32 sum.
DTYPE_FLAGS = {"bfloat16": "", "float32": STRICT_CPU}
# data=2,model=2 runs model=2's shards on half the rows each (no model code
# looks at the data axis), so model=2 alone adds nothing. Each forward runs
# on one of them, in turn (a mesh is a program to compile): a part's
# cached, verify and uncached forwards on MESHES[t], MESHES[t + 1],
# MESHES[t] (t its turn, then t + 1 for its second implementation), so
# every (arch, dtype, implementation) runs on both meshes, each forward of a
# kernel case meets both (one through each implementation), and the turns
# below give every (forward, mesh) pair to the reference in each dtype and
# to the kernels in float32.
MESHES = ["model=4", "data=2,model=2"]
FORWARDS = ("cached", "verify", "uncached")
# The kernels' sharding does not depend on the architecture: they run on one
# (arch, dtype) pair per dtype (and Dream's joined q/k/v below), the
# reference on all four.
KERNEL_CASES = {("llada", "bfloat16"), ("dream", "float32")}


@pytest.mark.parametrize("arch,dtype", [
    (a, d) for a in ("llada", "dream") for d in DTYPE_FLAGS] + [
        ("sdar", "float32"),  # SDAR: QK-norm on a dense model
        ("fast_dllm_v2", "float32")])  # Qwen2.5 blocks, token shift
def test_tensor_parallel_forward_is_bitwise_the_one_device_forward(
    arch, dtype, plain, strict):
  """Logits, caches and attention mass of cached, verify (no cache write,
  in-query keys, exclusions) and uncached forwards, through the reference
  and (KERNEL_CASES) the Pallas kernels interpreted, equal one device's bit
  for bit under model=4 and data=2,model=2 (each forward on one of them in
  turn, every implementation on both; pure data parallelism:
  tests/test_mesh.py): each output element is one full-length
  dot product, the kernel picks one device's key splits, and the mass is
  summed per head, gathered and summed over heads in one fixed order."""
  out = (strict if DTYPE_FLAGS[dtype] else plain)[f"bitwise {arch} {dtype}"]
  _check_bitwise(out, 2 if (arch, dtype) in KERNEL_CASES else 1)


def test_tensor_parallel_joined_qkv_is_bitwise_the_one_device_forward(
    strict):
  """The joined q/k/v projection (model/fuse.py) is column-sharded into
  whole heads: Dream's GQA forwards on both meshes equal one device's."""
  _check_bitwise(strict["bitwise joined qkv"], 1)


def test_every_forward_meets_every_mesh(plain, strict):
  """The turns cover each (forward, mesh) pair through the reference in
  both dtypes and through the kernels in float32."""
  for runs, impls in ((plain, ["reference"]),
                      (strict, ["reference", "pallas_interpret"])):
    equal = [line.split()[1:] for name, out in runs.items()
             if name.startswith("bitwise ") for line in out.splitlines()
             if line.startswith("EQUAL ")]
    for impl in impls:
      assert {(name, spec) for i, name, spec in equal if i == impl} == {
          (name, spec) for name in FORWARDS for spec in MESHES}, equal


def _check_bitwise(out: str, impls: int):
  """A BITWISE part passed, each implementation's three forwards compared
  on the meshes in turn (so on both)."""
  assert out.endswith("PASSED") and "BITWISE-OK" in out, out
  equal = [line.split()[1:] for line in out.splitlines()
           if line.startswith("EQUAL ")]
  assert len(equal) == 3 * impls, out
  for impl in {impl for impl, _, _ in equal}:
    done = [(name, spec) for i, name, spec in equal if i == impl]
    assert [name for name, _ in done] == list(FORWARDS), out
    assert {spec for _, spec in done} == set(MESHES), out


COLLECTIVES = r'''
import json, re
from flash_dllm_jax.model import CachedExtras, KVCache
config, params = tiny4("llada", head_dim=16, n_layers=2)
B, S, Q = 4, 64, 8
model = Transformer(config, implementation=ARGS)
extras = CachedExtras(mass_rows_BxQ=jnp.ones((B, Q), bool))

def forward(p, tokens, slots, valid, cache):
  (logits, new), state = model.apply(
      {"params": p}, tokens, slots, valid, cache=cache, slots_BxQ=slots,
      extras=extras, mutable=["intermediates"])
  return logits, new, state

mesh = parallel.parse_mesh("model=2")
slots = jnp.broadcast_to(jnp.arange(Q), (B, Q))
with parallel.use(mesh):
  text = jax.jit(forward).lower(
      parallel.shard_params(mesh, config, params),
      jnp.zeros((B, Q), jnp.int32), slots,
      jnp.ones((B, S), bool), jax.device_put(
          KVCache.zeros(config, B, S), jax.sharding.NamedSharding(
              mesh, parallel.CACHE_SPEC))).compile().as_text()
found = []
for line in text.splitlines():
  op = re.search(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|"
                 r"all-to-all|collective-permute)(-start)?\(", line)
  if op:
    name = re.search(r'op_name="([^"]*)"', line)
    found.append([op.group(2), [[int(n) for n in dims.split(",") if n]
                                for dims in re.findall(r"\w+\[([\d,]*)\]",
                                                       op.group(1))],
                  name.group(1) if name else ""])
weights = sorted({tuple(x.shape) for x in jax.tree.leaves(params)})
print("COLLECTIVES", json.dumps(dict(found=found, weights=weights,
                                     batch=B, layers=config.n_layers)))
'''


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
def test_tensor_parallel_gathers_activations_and_reduces_no_sum(impl, plain):
  """The compiled cached forward (2 layers, model=2) all-gathers only
  activations and masses (each leading with the batch rows: never a weight),
  among them attn_out's and down_proj's inputs and outputs, and all-reduces
  nothing but the vocabulary-sharded embedding lookup (a value plus zeros:
  exact)."""
  out = plain[f"collectives {impl}"]
  assert out.endswith("PASSED"), out
  info = json.loads(next(line for line in out.splitlines()
                         if line.startswith("COLLECTIVES "))[12:])
  found, layers = info["found"], info["layers"]
  weights = {tuple(w) for w in info["weights"]}
  assert {kind for kind, _, _ in found} <= {"all-gather", "all-reduce"}, found
  for kind, shapes, name in found:
    if kind == "all-reduce":
      assert "_take" in name and "layers_" not in name, (kind, shapes, name)
    for shape in shapes:
      assert tuple(shape) not in weights and shape[0] == info["batch"], (
          kind, shape, name)
  gathers = [name for kind, _, name in found if kind == "all-gather"]
  for layer in range(layers):
    for proj in ("attn_out", "down_proj"):
      assert sum(f"layers_{layer}/{proj}/" in n for n in gathers) == 1, (
          layer, proj, gathers)
  # Per layer: heads into attn_out, its columns, MLP columns into down_proj,
  # its columns, and the mass per head.
  assert len(gathers) == 5 * layers, found


def _bitwise(arch, dtype, turn, fused=False):
  """The BITWISE part of (arch, dtype), its first forward on MESHES[turn]."""
  impls = ("pallas_interpret" if fused else
           "pallas_interpret,reference" if (arch, dtype) in KERNEL_CASES
           else "reference")
  return (f"ARGS = {(arch, impls.split(','), dtype, MESHES, fused, turn)!r}"
          "\n" + BITWISE)


# Two interpreters for the module's scripts (a Python with JAX imported costs
# seconds): bfloat16 forwards and the collectives under XLA:CPU's default
# flags (its default optimisation level too: quick=False), float32 forwards
# under STRICT_CPU (DTYPE_FLAGS).
@pytest.fixture(scope="module")
def plain():
  return run_parts({
      "bitwise llada bfloat16": _bitwise("llada", "bfloat16", 0),
      "bitwise dream bfloat16": _bitwise("dream", "bfloat16", 0),
      **{f"collectives {impl}": f"ARGS = {impl!r}\n" + COLLECTIVES
         for impl in ("pallas_interpret", "reference")}}, quick=False)


@pytest.fixture(scope="module")
def strict():
  return run_parts({"bitwise llada float32": _bitwise("llada", "float32", 0),
                    "bitwise dream float32": _bitwise("dream", "float32", 0),
                    "bitwise sdar float32": _bitwise("sdar", "float32", 1),
                    "bitwise fast_dllm_v2 float32": _bitwise("fast_dllm_v2",
                                                             "float32", 0),
                    "bitwise joined qkv": _bitwise("dream", "float32", 1,
                                                   True)},
                   xla_flags=STRICT_CPU)
