"""Device timing and the two ceilings every benchmark is compared to."""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from flash_dllm_jax.eval.records import peak_memory_bytes  # noqa: F401 (re-exported)


def bench_params(config, seed: int = 0, pool: int = 1 << 22,
                 quantize: str | None = None, quantize_head: bool = False,
                 quantize_embedding: bool = False, mesh=None):
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
  8-bit weights plus one bf16 leaf.
  mesh (a parallel.parse_mesh mesh or spec): each leaf is computed on its
  shards where `parallel.param_spec` places it (every device computes only
  its own part: no device ever holds a whole expert stack), the values
  those of the unsharded build; 8-bit leaves stay on their shards."""
  from flax import traverse_util

  from flash_dllm_jax import quantize as quantized
  from flash_dllm_jax.model import init_params
  from flash_dllm_jax import parallel
  if pool & (pool - 1):
    raise ValueError(f"pool must be a power of two, got {pool}")
  mesh = parallel.parse_mesh(mesh)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  qconfig = config.replace(quantize=quantize, quantize_head=quantize_head,
                           quantize_embedding=quantize_embedding)
  paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  pool_P = jax.random.normal(jax.random.key(seed), (pool,), jnp.float32)
  if mesh is not None:
    parallel.check_config(config, mesh)
    pool_P = parallel.replicate(mesh, pool_P)
  leaves, flat = [], {}
  for i, (path, leaf) in enumerate(paths):
    name = "/".join(str(k.key) for k in path)
    sharding = None if mesh is None else NamedSharding(
        mesh, parallel.param_spec(config, name, tuple(leaf.shape), mesh))
    if leaf.ndim == 1:  # norm scales
      leaves.append(_ones_leaf(tuple(leaf.shape), jnp.dtype(leaf.dtype),
                               sharding)())
    else:
      scale = 1.0 if "embed" in name else leaf.shape[-2] ** -0.5
      offset = (i * 104_729) % pool  # a prime stride: leaves differ
      leaves.append(_tiled_leaf(tuple(leaf.shape), jnp.dtype(leaf.dtype),
                                sharding)(pool_P, jnp.uint32(offset),
                                          jnp.float32(scale)))
    if quantize is not None:
      flat.update(quantized.quantize_leaf(qconfig, name, leaves.pop()))
  if quantize is not None:
    params = traverse_util.unflatten_dict(flat, sep="/")
    return params if mesh is None else parallel.shard_params(
        mesh, qconfig, params)
  return jax.tree_util.tree_unflatten(treedef, leaves)


@functools.lru_cache(maxsize=None)
def _ones_leaf(shape, dtype, sharding):
  return jax.jit(lambda: jnp.ones(shape, dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _tiled_leaf(shape, dtype, sharding):
  """A function compiled once per (shape, dtype, sharding): (pool_P,
  offset, scale) -> the array whose flat element i is
  pool_P[(i - offset) mod P] * scale (the pool tiled from its own offset).
  Each element is a gather at its own index, so under `sharding` every
  device computes only its shard. Flat indices are taken modulo 2**32 and
  the pool's size P is a power of two, so the wrap-around is exact."""

  def build(pool_P, offset, scale):
    flat = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
      flat = flat + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * (
          jnp.uint32(stride % 2**32))
      stride *= shape[axis]
    index = (flat - offset) & jnp.uint32(pool_P.size - 1)
    return (pool_P[index.astype(jnp.int32)] * scale).astype(dtype)

  return jax.jit(build, out_shardings=sharding)


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
