"""Device timing and the two ceilings every benchmark is compared to."""

from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp

from flash_dllm_jax.eval.records import peak_memory_bytes  # noqa: F401 (re-exported)


def bench_params(config, seed: int = 0, pool: int = 1 << 22,
                 quantize: str | None = None, quantize_head: bool = False,
                 quantize_embedding: bool = False):
  """Parameters shaped and scaled like `init_params` (N(0, 1/fan_in)
  kernels, unit-variance embeddings, unit norm scales), built fast for
  benchmarks: one `pool`-sized normal draw, and each weight tiles that draw
  from its own offset (drawing 8B threefry normals took over a minute on an
  H200). Leaves are built one at a time by a function compiled once per
  distinct shape, so no giant program is compiled and the build costs about
  one write of the weights. Timing does not depend on the values; do not use
  these weights to judge quality.
  quantize (a format of flash_dllm_jax/quantize.py; quantize_head,
  quantize_embedding: the LM head, the embedding too): each weight is
  quantized on device as soon as it is built, so memory peaks near the
  8-bit weights plus one bf16 leaf."""
  from flax import traverse_util

  from flash_dllm_jax import quantize as quantized
  from flash_dllm_jax.model import init_params
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  qconfig = config.replace(quantize=quantize, quantize_head=quantize_head,
                           quantize_embedding=quantize_embedding)
  paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  pool_P = jax.random.normal(jax.random.key(seed), (pool,), jnp.float32)
  leaves, flat = [], {}
  for i, (path, leaf) in enumerate(paths):
    if leaf.ndim == 1:  # norm scales
      leaves.append(jnp.ones(leaf.shape, leaf.dtype))
    else:
      scale = 1.0 if "embed" in jax.tree_util.keystr(path) else (
          leaf.shape[-2] ** -0.5)
      offset = (i * 104_729) % pool  # a prime stride: leaves differ
      leaves.append(_tiled_leaf(pool_P, jnp.int32(offset),
                                jnp.float32(scale), tuple(leaf.shape),
                                jnp.dtype(leaf.dtype)))
    if quantize is not None:
      name = "/".join(str(k.key) for k in path)
      flat.update(quantized.quantize_leaf(qconfig, name, leaves.pop()))
  if quantize is not None:
    return traverse_util.unflatten_dict(flat, sep="/")
  return jax.tree_util.tree_unflatten(treedef, leaves)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _tiled_leaf(pool_P, offset, scale, shape, dtype):
  size = math.prod(shape)
  rolled_P = jnp.roll(pool_P, offset)
  tiled = jnp.tile(rolled_P, -(-size // pool_P.size))[:size]
  return (tiled * scale).astype(dtype).reshape(shape)


def time_fn(fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> float:
  """Median wall seconds of fn() with results blocked on (already compiled)."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def copy_bandwidth(gib: float = 4.0, reps: int = 20) -> float:
  """Device-to-device copy rate in bytes/s, counting bytes read + written."""
  n = int(gib * 2**30) // 4
  x = jax.random.uniform(jax.random.key(0), (n,), jnp.float32)
  copy = jax.jit(lambda a: a * 1.0000001)
  seconds = time_fn(lambda: copy(x), reps=reps)
  return 2 * n * 4 / seconds


def matmul_rate(n: int = 8192, reps: int = 20) -> float:
  """bf16 dense matmul FLOP/s on random data."""
  a = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(2), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda x, y: x @ y)
  seconds = time_fn(lambda: mm(a, b), reps=reps)
  return 2 * n**3 / seconds


def forward_flops(cfg, b: int, q: int, s: int, head_rows: int = 0) -> float:
  """FLOPs of one forward: b rows of q query tokens against s keys (matmuls
  and attention), plus the vocabulary head on head_rows rows per row. An
  MoE layer counts its router, its top_k routed and its shared experts."""
  e, f, d = cfg.d_model, cfg.mlp_hidden, cfg.head_dim
  proj = e * (cfg.n_heads + 2 * cfg.n_kv_heads) * d + cfg.n_heads * d * e
  per_token = 0
  for layer in range(cfg.n_layers):
    if cfg.is_moe_layer(layer):
      m = cfg.moe
      per_token += 2 * (proj + e * m.n_experts
                        + 3 * e * m.hidden * (m.top_k + m.n_shared))
    else:
      per_token += 2 * (proj + 3 * e * f)
  attention = 4 * cfg.n_layers * q * s * cfg.n_heads * d
  head = 2 * e * cfg.vocab_size * head_rows
  return b * (per_token * q + attention + head)


def decode_runner(cfg, params, sampler, b: int, prompt_len: int, mesh=None,
                  implementation=None):
  """A function that runs one compiled decode of b random prompts (every
  position decoded, no stop at EOS) and returns (gen_BxG, forwards_B, steps,
  steps_B). mesh: a parallel.parse_mesh mesh (or spec) to decode on; params
  and rows are placed on it first. implementation: as generate's (a
  string or an ops.Kernels)."""
  from flash_dllm_jax import parallel
  from flash_dllm_jax.generate import decode_jit
  prompt = jax.random.randint(jax.random.key(3), (b, prompt_len), 0,
                              cfg.mask_token_id - 1)
  valid = jnp.ones((b, prompt_len), bool)
  rng = jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32))
  mesh = parallel.parse_mesh(mesh)
  if mesh is not None:
    params = parallel.shard_params(mesh, cfg, params)
    prompt, valid, rng = (parallel.shard_rows(mesh, x)
                          for x in (prompt, valid, rng))

  def go():
    with parallel.use(mesh):
      return decode_jit(params, prompt, valid, rng, config=cfg,
                        sampler=sampler, stop_at_eos=False,
                        implementation=implementation)

  return go


def time_decode(cfg, params, sampler, b: int, prompt_len: int, reps: int,
                mesh=None, outputs: list | None = None, implementation=None):
  """Times one compiled decode of b random prompts (`decode_runner`).

  outputs: a list that receives the decode's result
  (gen_BxG, forwards_B, steps, steps_B).
  Returns (seconds per loop step, compile seconds, loop steps, most
  forwards of a row).
  """
  go = decode_runner(cfg, params, sampler, b, prompt_len, mesh,
                     implementation)
  t0 = time.perf_counter()
  out = jax.block_until_ready(go())
  if outputs is not None:
    outputs.append(out)
  first = time.perf_counter() - t0
  seconds = time_fn(go, reps=reps, warmup=0)
  steps = int(out[2])
  return seconds / steps, first - seconds, steps, int(out[1].max())
