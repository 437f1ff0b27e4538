"""Expert parallelism gives one device's bits (forced host devices).

Under a mesh each device holds X / M experts of every MoE layer and runs
them on its rows; each (token, slot) pair keeps its one device's value and
gets -0.0 from the others, so the psum over "model" is exact. Checked on
LLaDA2's uncached block-causal forward (float32, bfloat16, 8-bit experts)
and SDAR-30B-A3B's routing (softmax, no bias, no shared expert; float32),
the compiled program's collectives, a whole strategy-llada2 decode, and
the Hugging Face load onto a mesh.
"""

import json

from tests.mesh_case import PRELUDE, STRICT_CPU, run_script

SCRIPT = PRELUDE + r'''
import json, re, tempfile
from flax import traverse_util
import flash_dllm_jax as fdj
from flash_dllm_jax import quantize
from tests import llada2_fixtures
P = jax.sharding.PartitionSpec
EXPERTS = P("model", None, None)
report = {}

def forward(config):
  def fn(p, tokens, valid):
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    return Transformer(config).apply({"params": p}, tokens, positions, valid,
                                     blocks_BxQ=positions // 8)[0]
  return fn

def collectives(text):
  """[kind, result shapes, op name] of each collective of compiled HLO."""
  found = []
  for line in text.splitlines():
    op = re.search(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|"
                   r"all-to-all|collective-permute)(-start)?\(", line)
    if op:
      name = re.search(r'op_name="([^"]*)"', line)
      found.append([op.group(2), [[int(n) for n in d.split(",") if n] for d
                                  in re.findall(r"\w+\[([\d,]*)\]",
                                                op.group(1))],
                    name.group(1) if name else ""])
  return found

# 1. Uncached forwards (left padding, blocks of 8) on every mesh, bit for
# bit; model=4 leaves 2 experts per device, data=4 none split.
rng = np.random.default_rng(0)
tokens = jnp.asarray(rng.integers(0, 300, (4, 24)), jnp.int32)
valid = jnp.arange(24)[None, :] >= jnp.array([0, 5, 11, 2])[:, None]
# SDAR-30B-A3B's routing: softmax, no expert bias, no shared expert.
from flash_dllm_jax.moe_config import MoEConfig
SDAR_MOE = dict(moe=MoEConfig(n_experts=8, top_k=2, hidden=32, n_shared=0,
                              first_dense_layers=1, score="softmax",
                              expert_bias=False))
cases = [("llada2", "float32", None, "model=4;data=2,model=2;data=4"),
         ("llada2", "bfloat16", None, "data=2,model=2"),
         ("llada2", "bfloat16", "int8", "model=4;data=2,model=2"),
         ("sdar", "float32", None, "model=2;data=2,model=2")]
for arch, dtype, fmt, specs in cases:
  config, params = tiny4(arch, dtype=dtype,
                         **(SDAR_MOE if arch == "sdar" else {}))
  if fmt:
    config = config.replace(quantize=fmt)
    params = quantize.quantize_params(params, config)
  one = jax.jit(forward(config))(params, tokens, valid)
  for spec in specs.split(";"):
    mesh = parallel.parse_mesh(spec)
    sharded = parallel.shard_params(mesh, config, params)
    for name in ("experts_gate", "experts_up", "experts_down"):
      for leaf in sharded["layers_1"]["moe"][name].values():
        assert leaf.sharding.spec == EXPERTS, (name, leaf.sharding)
    with parallel.use(mesh):
      compiled = jax.jit(forward(config)).lower(sharded, tokens,
                                                valid).compile()
    got = compiled(sharded, tokens, valid)
    np.testing.assert_array_equal(got, one, f"{arch} {dtype} {fmt} {spec}")
    if (arch, dtype, spec) == ("llada2", "float32", "data=2,model=2"):
      report["collectives"] = collectives(compiled.as_text())
      report["weights"] = sorted({tuple(x.shape)
                                  for x in jax.tree.leaves(params)})
  print(arch, dtype, fmt, "equal on", specs, flush=True)

# 2. A whole decode with strategy llada2: tokens and model calls.
config, params = tiny4("llada2")
prompts = random_prompts(50, [5, 13, 9])
opts = dict(strategy="llada2", gen_length=16, block_length=8, steps=4,
            threshold=0.6)
one = generate(params, prompts, config=config, **opts)
out = generate(params, prompts, config=config, mesh="data=2,model=2", **opts)
np.testing.assert_array_equal(out.tokens_BxG, one.tokens_BxG)
np.testing.assert_array_equal(out.forwards_B, one.forwards_B)
print("generate equal", flush=True)

# 3. The genuine-format directory loads its expert stacks onto their shards.
path, _, _ = llada2_fixtures.write_llada2(tempfile.mkdtemp() + "/hf")
flat = lambda p: traverse_util.flatten_dict(p, sep="/")
params, config, _ = fdj.load(path)
mesh = parallel.parse_mesh("model=2")
two = flat(fdj.load(path, mesh=mesh)[0])
stacks = 0
for p, a in flat(params).items():
  want = parallel.param_spec(config, p, a.shape, mesh)
  assert two[p].sharding.spec == want, (p, two[p].sharding, want)
  stacks += want == EXPERTS
  np.testing.assert_array_equal(np.asarray(two[p]), np.asarray(a))
assert stacks == 3 * (config.n_layers - config.moe.first_dense_layers), stacks
print("EXPERTS-OK", json.dumps(report))
'''


def test_expert_parallel_forward_decode_and_load_are_one_devices():
  """Forwards equal one device's bits on model=4 (2 experts a device),
  data=2,model=2 and data=4, with float32, bfloat16 and 8-bit experts
  (and SDAR-MoE's softmax routing on model=2 and data=2,model=2); the
  expert stacks stay sharded: the compiled forward gathers no weight and
  all-reduces only the embedding lookup and, per MoE layer, the experts'
  outputs of each data shard's (token, slot) pairs; a strategy-llada2
  decode gives one device's tokens; the HF load puts each stack on its
  shards. STRICT_CPU for both dtypes: the 8-bit projections' products are
  float32 (tests/test_quantize_mesh.py)."""
  out = run_script(SCRIPT, xla_flags=STRICT_CPU)
  report = json.loads(out.split("EXPERTS-OK", 1)[1])
  weights = {tuple(w) for w in report["weights"]}
  found = report["collectives"]
  assert {kind for kind, _, _ in found} <= {"all-gather", "all-reduce"}, found
  for kind, shapes, name in found:
    assert "experts_" not in name, (kind, shapes, name)
    for shape in shapes:
      assert tuple(shape) not in weights, (kind, shape, name)
  reduced = [(shapes, name) for kind, shapes, name in found
             if kind == "all-reduce"]
  # embedding rows (B/2 rows of 24), the MoE layer's [T/2 pairs' rows, K, E]
  assert sorted(reduced) == sorted([([[2, 24, 64]], reduced[0][1]),
                                    ([[48, 2, 64]], reduced[1][1])]), found
  assert "_take" in reduced[0][1] and "moe/shard_map" in reduced[1][1], found
