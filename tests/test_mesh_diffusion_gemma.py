"""diffusion-gemma on meshes of forced host CPU devices, against one
device in the same interpreter: rows split over `data`, weights over
`model` (heads, MLP columns, experts; the global layers' one kv head
replicated) and both give every row its one-device tokens, steps, forwards
and logprobs; the batched fast forward (a GPU decode's) its one-device
logits and cache bit for bit (8-bit weights too); a `model` that does not
divide the heads is refused with one error."""

from tests.mesh_case import STRICT_CPU, run_script

SCRIPT = r'''
import re
import jax, jax.numpy as jnp, numpy as np
assert len(jax.devices()) == 4, jax.devices()
from flash_dllm_jax import checkpoint, compilation, parallel
compilation.enable_persistent_cache(compilation.default_cache_dir())
from flash_dllm_jax.architectures.diffusion_gemma import fast, model as ref
from flash_dllm_jax.generate import generate
from tests.diffusion_gemma_case import PROMPTS, SEEDS, SETTINGS, TINY
MESHES = ("data=2", "model=2", "data=2,model=2")

# Sharded load: heads, MLP columns and experts split, the global layers'
# single kv head (k_einsum [1, D, H]) and the tied embedding replicated.
models = {m: checkpoint.load(TINY, dtype="float32", mesh=m) for m in MESHES}
from jax.sharding import PartitionSpec as P
spec = lambda path: parallel._flat(models["model=2"][0])[path].sharding.spec
for path, want in (("layer_0/attn/q_einsum/w", P("model", None, None)),
                   ("layer_0/attn/kv_einsum/w", P(None, "model", None, None)),
                   ("layer_0/mlp/gating_einsum/w", P("model", *[None] * 3)),
                   ("layer_2/attn/k_einsum/w", P()),
                   ("embedder/input_embedding", P())):
  assert spec(path) == want, (path, spec(path))

# The batched fast forward (a GPU decode's) of a denoising pass.
params, config = models["data=2"][0], models["data=2"][1]
one_params = jax.tree.map(np.asarray, params)
rng = np.random.default_rng(0)
B, S, Q = 4, 16, 6
cache = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
                     ref.empty_cache(config, B, S, jnp.float32))
tokens = jnp.asarray(rng.integers(0, 160, (B, Q)), jnp.int32)
slots = jnp.asarray(np.arange(Q)[None] + np.arange(3, 3 + B)[:, None],
                    jnp.int32)
sc = jnp.asarray(rng.normal(size=(B, Q, config.d_model)), jnp.float32)
pass_ = lambda p, c: fast.forward(p, config, tokens, slots, c,
                                  ref.canvas(slots), sc,
                                  implementation="reference")
want = jax.tree.map(np.asarray, jax.jit(pass_)(one_params, cache))
for m in MESHES[1:]:
  with parallel.use(parallel.parse_mesh(m)):
    step = jax.jit(pass_)
    got = jax.tree.map(np.asarray, step(models[m][0], cache))
    hlo = step.lower(models[m][0], cache).compile().as_text()
  same = jax.tree.leaves(jax.tree.map(np.array_equal, want, got))
  assert all(same), (m, same)
  # Float sums across devices: the experts' psum only (one a MoE layer).
  reduces = len(re.findall(r"= f32\[[^\]]*\][^ ]* all-reduce\(", hlo))
  print(m, "forward ok, all-reduces", reduces, flush=True)

# 8-bit weights: the expert stacks load split, the rest replicated.
int8 = {m: checkpoint.load(TINY, dtype="float32", quantize="int8", mesh=m)
        for m in (None, "model=2")}
assert parallel._flat(int8["model=2"][0])[
    "layer_0/mlp/linear/w/kernel_q"].sharding.spec == P("model", None, None)
q_pass = lambda p, c: fast.forward(p, int8[None][1], tokens, slots, c,
                                   ref.canvas(slots), sc,
                                   implementation="reference")
want = jax.tree.map(np.asarray, jax.jit(q_pass)(int8[None][0], cache))
with parallel.use(parallel.parse_mesh("model=2")):
  got = jax.tree.map(np.asarray, jax.jit(q_pass)(int8["model=2"][0], cache))
assert all(jax.tree.leaves(jax.tree.map(np.array_equal, want, got)))
print("int8 model=2 forward ok", flush=True)

# Decodes on data=2 (rows split, weights whole) and data=2,model=2 (rows
# and weights split): model=2's forward is checked bit for bit above, and
# no sampler code reads the model axis.
model = checkpoint.load(TINY, dtype="float32")
one = generate(model, PROMPTS[:4], seed=SEEDS[:4], logprobs=True, **SETTINGS)
for m in ("data=2", "data=2,model=2"):
  out = generate(models[m], PROMPTS[:4], seed=SEEDS[:4], logprobs=True,
                 mesh=m, **SETTINGS)
  for name in ("tokens_BxG", "steps_B", "forwards_B", "logprobs_BxG"):
    assert np.array_equal(getattr(one, name), getattr(out, name)), (m, name)
  print(m, "decode ok", flush=True)
try:
  generate(model, PROMPTS[:2], seed=SEEDS[:2], mesh="model=3", **SETTINGS)
except ValueError as e:
  print("refused:", e)
'''


def test_meshes_keep_a_rows_one_device_answer_and_logits():
  # STRICT_CPU: XLA:CPU's float32 GEMM keeps a column's bits whatever the
  # columns beside it only under these flags (tests/mesh_case.py).
  out = run_script(SCRIPT, devices=4, xla_flags=STRICT_CPU)
  for m in ("model=2", "data=2,model=2"):
    assert f"{m} forward ok, all-reduces 6" in out, out
  for m in ("data=2", "data=2,model=2"):
    assert f"{m} decode ok" in out, out
  assert "int8 model=2 forward ok" in out, out
  assert ("refused: mesh model=3 must divide the attention heads" in out
          and "n_heads=4" in out), out
