"""LLaDA2.0-flash on one host's GPUs, checked on the CPU: the published
config reads as the preset, its shapes split over the mesh layouts the
multi-GPU benchmark runs, random bench weights are built on their shards,
and the benchmark runs end to end on a CPU mesh."""

import json

import jax

from flash_dllm_jax.architectures.llada2 import read_hf_config
from flash_dllm_jax.config import ModelConfig
from tests.mesh_case import ROOT, run_script

REF = ROOT / "tests" / "reference"


def test_flash_config_reads_as_the_preset():
  hf = json.loads((REF / "llada2-flash" / "config.json").read_text())
  special = json.loads((REF / "llada2-mini" / "special_tokens.json")
                       .read_text())
  got = ModelConfig(**read_hf_config(hf, special))
  want = ModelConfig.preset("llada2-flash")
  assert got.replace(bos_token_id=want.bos_token_id) == want
  # the parameter count: the dense layer and one MoE layer built
  # abstractly, the other 30 MoE layers like the second
  from flash_dllm_jax.model import init_params
  count = lambda n: sum(x.size for x in jax.tree.leaves(jax.eval_shape(
      lambda: init_params(want.replace(n_layers=n), jax.random.key(0)))))
  total = count(2) + 30 * (count(3) - count(2))
  e, v, m = 4096, 157184, want.moe
  attention = e * (32 + 2 * 4) * 128 + 32 * 128 * e + 2 * 128 + 2 * e
  moe_layer = (attention + e * m.n_experts + m.n_experts  # router, bias
               + 3 * e * m.hidden * (m.n_experts + m.n_shared))
  dense_layer = attention + 3 * e * 9216
  assert total == 2 * v * e + e + dense_layer + 31 * moe_layer
  assert round(total / 1e9, 1) == 102.9  # the "100B" of the model card


# One fresh Python on 8 CPU devices: the layouts, the sharded build, and the
# benchmark's smoke run (one format, one strategy, one device and a mesh).
SCRIPT = r'''
import json, sys
import jax, numpy as np
from flash_dllm_bench import timing
from flash_dllm_jax import parallel
from flash_dllm_jax.config import ModelConfig
assert len(jax.devices()) == 8

flash = ModelConfig.preset("llada2-flash")
for spec in ("model=4", "data=2,model=4", "data=8"):
  parallel.check_config(flash, parallel.parse_mesh(spec))
try:
  parallel.check_config(flash, parallel.parse_mesh("model=8"))
  raise AssertionError("model=8 accepted")
except ValueError as e:
  assert "n_kv_heads=4" in str(e), e
print("layouts ok")

cfg = ModelConfig.tiny("llada2", dtype="bfloat16", n_heads=8, n_kv_heads=4,
                       head_dim=16)
one = timing.bench_params(cfg)
for fmt in (None, "fp8"):
  mesh = parallel.parse_mesh("data=2,model=4")
  p = timing.bench_params(cfg, quantize=fmt, mesh=mesh)
  qcfg = cfg.replace(quantize=fmt)
  want = parallel.param_shardings(mesh, qcfg, p)
  for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(p)[0],
                          jax.tree.leaves(want)):
    name = jax.tree_util.keystr(path)
    assert x.sharding.is_equivalent_to(s, x.ndim), (name, x.sharding, s)
    if "experts_" in name:  # an expert stack: a quarter on each device
      assert {sh.data.shape[0] for sh in x.addressable_shards} == {
          x.shape[0] // 4}, name
  if fmt is None:  # the values of the one-device build
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(p)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
print("sharded build ok")

sys.path.insert(0, "scripts")
import bench_flash_mesh
bench_flash_mesh.main(["--smoke", "--meshes", "none", "data=2,model=4",
                       "model=8", "--formats", "bf16", "--strategies",
                       "llada2", "--json", sys.argv[1]])
'''


def test_flash_mesh_on_cpu_devices(tmp_path):
  out = run_script(SCRIPT, str(tmp_path / "flash.json"), devices=8)
  assert "layouts ok" in out and "sharded build ok" in out
  result = json.loads((tmp_path / "flash.json").read_text())
  assert [r["mesh"] for r in result["rows"]] == ["none", "data=2,model=4"]
  for r in result["rows"]:
    assert "error" not in r, r
    assert r["ms"] > 0 and r["floor_ms"] > 0 and r["tok_s_gpu"] > 0
  mesh_row = result["rows"][1]
  assert mesh_row["devices"] == 8 and len(mesh_row["peak_gb"]) == 8
  assert result["tokens_equal"] == {
      "bf16 llada2 batch 2: data=2,model=4 = none": True}
  assert [s["mesh"] for s in result["skipped"]] == ["model=8"]
  assert "token ids bf16 llada2 batch 2: data=2,model=4 = none: equal" in out
