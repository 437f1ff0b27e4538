"""What the mesh tests share: a subprocess runner on forced host devices,
the strict XLA:CPU flags for bit-for-bit forwards, and the scripts' prelude
of tiny models."""

import os
import platform
import subprocess
import sys
from pathlib import Path

from tests.compile_level import QUICK_FLAGS

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


# Added to every script's XLA flags unless it asks for XLA's defaults: the
# scripts' tiny programs run for milliseconds, and LLVM's optimisation passes
# took about half of a decode's compile (a Flash-dLLM verify decode: 8.1 CPU
# seconds at the default level, 4.3 at 0); XLA:CPU's MLIR fusion emitters
# took about half of what was left (two decodes, one device and
# data=2,model=2 each: 18.1 CPU seconds with them, 9.3 with the elemental
# emitters). Every comparison a script makes is between programs compiled
# under the same flags; a claim about XLA's default flags asks for them
# (quick=False).
QUICK_COMPILE = QUICK_FLAGS


def script_env(devices: int = 4, xla_flags: str = "",
               quick: bool = True) -> dict:
  """The environment of a fresh Python on `devices` forced host CPU devices
  (QUICK_COMPILE unless `quick` is False)."""
  flags = f"--xla_force_host_platform_device_count={devices} {xla_flags}"
  return dict(os.environ, XLA_FLAGS=flags + (f" {QUICK_COMPILE}" if quick
                                             else ""),
              JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))


def run_script(script: str, *args: str, devices: int = 4, timeout: int = 600,
               xla_flags: str = "", quick: bool = True):
  """Runs `script` in a fresh Python on `devices` forced host CPU devices
  (script_env); returns its stdout (a failure shows its output)."""
  env = script_env(devices, xla_flags, quick)
  result = subprocess.run([sys.executable, "-c", script, *args], env=env,
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  return result.stdout


# Shared by the subprocess scripts: tiny models whose heads (8, KV 4) and
# MLP width split 4 ways, with tests.test_sampling's sharp logits and EOS.
PRELUDE = r'''
import os
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
assert len(jax.devices()) == 4, jax.devices()
from flash_dllm_jax import compilation, parallel
# The test run's compilation cache (tests/conftest.py): the scripts share
# what they compile with each other and with the test processes
# ($FLASH_DLLM_JAX_CACHE_DIR=off: none).
compilation.enable_persistent_cache(compilation.default_cache_dir())
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import generate
from flash_dllm_jax.model import KVCache, Transformer, init_params
from tests.test_sampling import random_prompts

def cached_inputs(config, rng, B, S, Q, dtype):
  """Random (cache, tokens_BxQ, slots_BxQ, valid_BxS) of a cached forward:
  a cache of S keys per layer, Q distinct slots per row."""
  K, D = config.n_kv_heads, config.head_dim
  kv = lambda: tuple(jnp.asarray(rng.normal(size=(B, S, K, D)), dtype)
                     for _ in range(config.n_layers))
  cache = KVCache(kv(), kv())
  tokens = jnp.asarray(rng.integers(0, 300, (B, Q)), jnp.int32)
  slots = jnp.asarray(np.stack([rng.permutation(S)[:Q] for _ in range(B)]),
                      jnp.int32)
  return cache, tokens, slots, jnp.asarray(rng.random((B, S)) > 0.2)


def set_up(fn, *args):
  """fn(*args) compiled at level 0 with the elemental emitters, whatever
  the script's flags: a tiny model's set-up, which no claim is about."""
  return jax.jit(fn).lower(*args).compile(
      {"xla_backend_optimization_level": 0,
       "xla_cpu_use_fusion_emitters": False})(*args)


def tiny4(arch, eos_boost=1.2, **changes):
  config = ModelConfig.tiny(arch, **{**dict(n_heads=8, n_kv_heads=4,
                                            head_dim=8), **changes})
  params = set_up(lambda key: init_params(config, key, head_init_scale=8.0),
                  jax.random.key(7))
  x = np.asarray(random_prompts(0, [24] * 4), np.int32)
  x[:, 8:] = config.mask_token_id
  pos = jnp.broadcast_to(jnp.arange(24), x.shape)
  logits, _ = set_up(lambda p, *a: Transformer(config).apply({"params": p}, *a),
                     params, jnp.asarray(x), pos, jnp.ones(x.shape, bool))
  common = np.bincount(np.asarray(logits.argmax(-1)).ravel()).argmax()
  head = params["lm_head"]
  params["lm_head"] = head.at[:, config.eos_token_id].set(
      head[:, common] * (1 + eos_boost / 100))
  return config, params
'''


_PARTS = r'''
import traceback
_base = dict(globals())
for _name, _source in _PARTS.items():
  print(f"@@PART {_name}", flush=True)
  try:
    exec(compile(_source, f"<part {_name}>", "exec"), dict(_base))
  except BaseException:
    traceback.print_exc(file=sys.stdout)
    print(f"@@FAILED {_name}", flush=True)
  else:
    print(f"@@PASSED {_name}", flush=True)
'''


def run_parts(parts: dict[str, str], *args: str, devices: int = 4,
              xla_flags: str = "", timeout: int = 600,
              quick: bool = True) -> dict[str, str]:
  """Runs the scripts `parts` (name -> source, PRELUDE's names in scope,
  sys.argv[1:] = `args`) one after another in one fresh Python, each in its
  own namespace: one interpreter start and JAX import for all (seconds
  each). Returns name -> that part's output, ending in 'PASSED' or, after
  its traceback, 'FAILED'. A part that patches a module (jax.device_put)
  must undo it, or come last. `timeout` is per part."""
  script = (PRELUDE + "\nimport sys\n_PARTS = " + repr(parts) + "\n"
            + _PARTS)
  out = run_script(script, *args, devices=devices, xla_flags=xla_flags,
                   timeout=timeout * len(parts), quick=quick)
  found = {}
  for chunk in out.split("@@PART ")[1:]:
    name, _, text = chunk.partition("\n")
    found[name] = text.replace(f"@@PASSED {name}", "PASSED").replace(
        f"@@FAILED {name}", "FAILED").rstrip()
  assert list(found) == list(parts), out[-4000:]
  return found
