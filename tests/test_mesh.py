"""Device meshes on forced host devices: data and tensor parallelism give the
one-device tokens for every strategy, the kernels run per shard, loading
puts each weight straight onto its shards, evaluation splits problems across
processes, and the multi-GPU benchmark runs (--smoke).

Exactness: no float sum crosses devices (parallel.py), so a forward under
any mesh gives the one-device bits; tests/test_mesh_exact.py checks that
for every forward and the compiled collectives. The forwards compared here
run under STRICT_CPU.
"""

import json
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import pytest

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.parallel import check_config, initialize_distributed, \
    param_spec, parse_mesh

ROOT = Path(__file__).resolve().parents[1]
MESHES = ["data=1,model=4", "data=2,model=2", "data=4,model=1"]

# XLA:CPU flags under which float32 forwards are compared bit for bit.
# Exact tensor parallelism needs a GEMM that computes a column the same way
# whatever the number of columns beside it (tools/probe_column_invariance.py)
# and elementwise code that rounds the same way in every program. XLA:CPU
# (jax 0.10) has neither by default in float32: its YNNPACK GEMM sums narrow
# column shards in another order, and LLVM contracts a*b + c*d into an FMA
# or not depending on the fusion around it. Its Eigen GEMM (no YNNPACK
# fusion) and x86 code without FMA (AVX) have both at these sizes.
STRICT_CPU = "--xla_cpu_experimental_ynn_fusion_type=" + (
    " --xla_cpu_max_isa=AVX" if platform.machine() in ("x86_64", "AMD64")
    else "")


def _run(script: str, *args: str, devices: int = 4, timeout: int = 600,
         xla_flags: str = ""):
  env = dict(os.environ, XLA_FLAGS=(
      f"--xla_force_host_platform_device_count={devices} {xla_flags}"),
             JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  result = subprocess.run([sys.executable, "-c", script, *args], env=env,
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  return result.stdout


# Shared by the subprocess scripts: tiny models whose heads (8, KV 4) and
# MLP width split 4 ways, with tests.test_sampling's sharp logits and EOS.
PRELUDE = r'''
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
assert len(jax.devices()) == 4, jax.devices()
from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import generate
from flash_dllm_jax.model import Transformer, init_params
from tests.test_sampling import random_prompts

def tiny4(arch, eos_boost=1.2, **changes):
  config = ModelConfig.tiny(arch, **{**dict(n_heads=8, n_kv_heads=4,
                                            head_dim=8), **changes})
  params = init_params(config, jax.random.key(7), head_init_scale=8.0)
  x = np.asarray(random_prompts(0, [24] * 4), np.int32)
  x[:, 8:] = config.mask_token_id
  pos = jnp.broadcast_to(jnp.arange(24), x.shape)
  logits, _ = Transformer(config).apply({"params": params}, jnp.asarray(x),
                                        pos, jnp.ones(x.shape, bool))
  common = np.bincount(np.asarray(logits.argmax(-1)).ravel()).argmax()
  head = params["lm_head"]
  params["lm_head"] = head.at[:, config.eos_token_id].set(
      head[:, common] * (1 + eos_boost / 100))
  return config, params
'''

STRATEGIES = PRELUDE + r'''
import sys, time
from flash_dllm_jax import sampling
from flash_dllm_jax.sampling import DreamSampler, FastDLLMSampler, LLaDASampler
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
if hasattr(sampling, "ElasticCacheSampler"):
  cases.append(("llada", sampling.ElasticCacheSampler(
      gen_length=16, window=4, track_num=1, gamma=0.9)))
  print("ELASTIC")
prompts = random_prompts(50, [4, 13, 9, 30, 6, 11])  # 6 rows: padded to 8
models = {arch: tiny4(arch) for arch in ("llada", "dream")}
for arch, sampler in cases:
  t0 = time.time()
  config, params = models[arch]
  one = generate(params, prompts, config=config, sampler=sampler, seed=5)
  for spec in meshes:
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


def test_every_strategy_gives_the_one_device_tokens_on_every_mesh():
  out = _run(STRATEGIES, ";".join(MESHES))
  n = 9 if "ELASTIC" in out else 8
  assert f"MESH-OK {n}" in out, out


KERNELS_AND_LOADING = PRELUDE + r'''
import sys, tempfile
from pathlib import Path
from flash_dllm_jax import checkpoint
from flash_dllm_jax.model import CachedExtras, KVCache
from flash_dllm_jax.sampling import LLaDASampler

# 1. A cached forward through the Pallas kernels (interpreted) under each
# mesh: kernels (norms included) per shard via shard_map, caches sharded
# along heads, and the one-device logits, caches and mass, bit for bit.
config, params = tiny4("llada", head_dim=32, n_layers=1)
rng = np.random.default_rng(0)
B, S, Q, K = 4, 32, 8, config.n_kv_heads
kv = lambda: (jnp.asarray(rng.normal(size=(B, S, K, 32)), jnp.float32),)
cache = KVCache(kv(), kv())
tokens = jnp.asarray(rng.integers(0, 300, (B, Q)), jnp.int32)
slots = jnp.asarray(np.stack([rng.permutation(S)[:Q] for _ in range(B)]),
                    jnp.int32)
valid = jnp.asarray(rng.random((B, S)) > 0.2)
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
  args = [parallel.shard_params(mesh, params)]
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
print("KERNELS-OK")

# 2. Loading straight onto shards: every host-to-device transfer carries one
# shard, never a whole sharded weight, and decoding the loaded model gives
# the tokens of the unsharded load.
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
prompts = random_prompts(3, [5, 9, 17, 3])
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
    want = parallel.param_spec(path, x.shape, mesh)
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


def test_kernels_per_shard_and_loading_onto_shards():
  out = _run(KERNELS_AND_LOADING, ";".join(MESHES), xla_flags=STRICT_CPU)
  for tag in ("KERNELS-OK", "LOADING-OK", "ERRORS-OK"):
    assert tag in out, out


def test_bench_mesh_smoke(tmp_path):
  out = _run(f"import runpy, sys; sys.argv = ['bench_mesh.py', '--smoke', "
             f"{str(tmp_path / 'mesh.json')!r}]; runpy.run_path("
             f"'scripts/bench_mesh.py', run_name='__main__')")
  result = json.loads((tmp_path / "mesh.json").read_text())
  assert "data parallel: 2 GPUs / 1 GPU tokens/s" in out, out
  assert result["dp_tokens_per_s_ratio"] > 0
  assert set(result["tp_step_speedup"]) == {"1", "4"}
  meshed = [r for r in result["rows"] if r["gpus"] == 2]
  assert len(meshed) == 3
  # Data parallelism changes no sum: the same tokens. Tensor parallelism is
  # exact only where the GEMM is column-invariant (STRICT_CPU), which this
  # benchmark does not assume: only reported.
  assert [r["tokens_equal_1gpu"] for r in meshed if r["kind"] == "data"] \
      == [1.0]
  assert all(0.0 <= r["tokens_equal_1gpu"] <= 1.0 for r in meshed)


def test_eval_shards_problems_across_processes_and_merges(tmp_path):
  """Two simulated processes (process=(i, 2)): each decodes problems i, i+2,
  ... into its own JSONL; process 0 merges them into the records and summary
  that one process writes."""
  import flash_dllm_jax
  from tests.paths import TINY_CHECKPOINT
  from flash_dllm_jax.eval import runner
  from flash_dllm_jax.eval.tasks.gsm8k import GSM8K
  from flash_dllm_jax.sampling import LLaDASampler

  model = flash_dllm_jax.load(TINY_CHECKPOINT)
  sampler = LLaDASampler(gen_length=16, steps=8, block_length=8)
  settings = {"task": "gsm8k", "strategy": "llada", "batch_size": 2}
  run = lambda d, **kw: runner.run_eval(
      GSM8K(num_fewshot=0), model, sampler, tmp_path / d, settings,
      batch_size=2, limit=5, progress=False, **kw)
  one = run("one")
  assert run("two", process=(1, 2)) is None
  assert not (tmp_path / "two/records.jsonl").exists()
  two = run("two", process=(0, 2))
  lines = lambda p: [json.loads(x) for x in p.read_text().splitlines()]
  shard1 = lines(tmp_path / "two/records.1-of-2.jsonl")
  all_ids = [r["id"] for r in lines(tmp_path / "one/records.jsonl")]
  assert sorted(r["id"] for r in shard1) == ["gsm8k/1", "gsm8k/3"]
  keep = ("id", "token_ids", "raw_output", "correct", "forwards", "steps")
  ref = {r["id"]: {k: r[k] for k in keep}
         for r in lines(tmp_path / "one/records.jsonl")}
  merged = {r["id"]: {k: r[k] for k in keep}
            for r in lines(tmp_path / "two/records.jsonl")}
  assert merged == ref and len(merged) == len(all_ids) == 5
  for key in ("problems", "correct", "generated_tokens", "forwards"):
    assert two[key] == one[key], key
  again = run("two", process=(0, 2))  # resuming a finished run adds nothing
  assert len(lines(tmp_path / "two/records.jsonl")) == 5
  assert again["problems"] == 5


def test_param_specs_shard_every_projection_by_columns():
  mesh = types.SimpleNamespace(shape={"data": 2, "model": 4})
  cases = {"layers_0/q_proj/kernel": ("", "model"),
           "layers_3/k_proj/bias": ("model",),
           "layers_1/up_proj/kernel": ("", "model"),
           "layers_1/down_proj/kernel": ("", "model"),
           "layers_1/attn_out/kernel": ("", "model"),
           "embed": ("model", ""), "lm_head": (),
           "layers_2/mlp_norm/scale": (), "final_norm/scale": ()}
  for path, want in cases.items():
    spec = param_spec(path, (64, 64) if len(want) != 1 else (64,), mesh)
    assert tuple(a or "" for a in spec) == want, path
  # a vocabulary the mesh does not divide: the embedding stays whole
  assert tuple(param_spec("embed", (385, 64), mesh)) == ()


@pytest.mark.parametrize("spec,message", [
    ("data=0", "bad mesh spec"), ("rows=2", "bad mesh spec"),
    ("data=2,data=2", "bad mesh spec"), ("model=x", "bad mesh spec"),
    ("data=64", "devices"), ("data=2,model=2", "devices")])
def test_bad_mesh_specs(spec, message):
  with pytest.raises(ValueError, match=message):
    parse_mesh(spec)  # this process has one CPU device


@pytest.mark.parametrize("config,model,message", [
    (ModelConfig.tiny("llada"), 4, "n_kv_heads=2"),
    (ModelConfig.tiny("llada"), 3, "n_heads=4, n_kv_heads=2"),
    (ModelConfig.dream_7b(), 8, "n_heads=28, n_kv_heads=4"),
])
def test_model_axis_must_divide_heads(config, model, message):
  mesh = types.SimpleNamespace(shape={"data": 1, "model": model})
  with pytest.raises(ValueError, match=message):
    check_config(config, mesh)
  check_config(ModelConfig.llada_8b(), types.SimpleNamespace(
      shape={"data": 1, "model": 8}))  # 32 heads, 32 KV heads: fine


def test_initialize_distributed_reads_the_environment(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
              "JAX_PROCESS_ID", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
    monkeypatch.delenv(var, raising=False)
  assert initialize_distributed() is False  # one process: nothing to start
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
    initialize_distributed()
  calls = []
  monkeypatch.setattr("jax.distributed.initialize",
                      lambda *a, **k: calls.append((a, k)))
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert initialize_distributed() is True
  assert calls == [(("10.0.0.1:1234",),
                    {"num_processes": 2, "process_id": 1})]


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


def test_fused_attention_runs_per_shard_and_ignores_the_mesh():
  """The GPU attention path (forced here; XLA's composition on CPU) runs per
  shard under every mesh (rows on data, heads on model: no sum crosses
  shards) and gives the one-device bits."""
  assert "FUSED-OK" in _run(FUSED_ATTENTION, xla_flags=STRICT_CPU)


def test_linear_asks_for_bf16_products_only_on_a_gpu_without_model_shards():
  """ops.linear's direct bf16 product (cuBLAS: float32 accumulation, one
  rounding) is for GPUs, and not under tensor parallelism; CPUs and model
  shards keep the float32 product and a cast."""
  script = PRELUDE + r'''
from flash_dllm_jax import ops
x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16)

def product_dtypes(bias=None):
  jaxpr = jax.jit(lambda x, w: ops.linear(x, w, bias)).trace(x, w).jaxpr
  return [str(e.params["preferred_element_type"]) for e in jaxpr.eqns
          if e.primitive.name == "dot_general"]

seen = {"cpu": product_dtypes()}
ops.jax.default_backend = lambda: "gpu"  # what the trace asks; runs on CPU
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
  assert _run(script).strip().endswith("ok")
