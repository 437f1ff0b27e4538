"""Device meshes: data parallelism, tensor parallelism and several processes.

`--mesh data=D,model=M` lays D x M local devices out as a ("data", "model")
mesh and lets XLA's SPMD partitioner compile the unchanged decode loop:

  data   splits the batch: prompts, padding masks and PRNG keys are sharded
         along rows; rows are independent, so no communication but the loop's
         "all rows done?" reduction.
  model  splits the weights tensor-parallel by output columns: q/k/v and
         gate/up give whole attention heads and MLP columns per device;
         attn_out and down all-gather their input (heads, MLP columns) and
         their output columns (`ops.linear(gathered=True)`). No float sum
         crosses devices, so every element is the one-device dot product,
         bit for bit (Megatron's row-sharded attn_out and down would add
         per-device partial sums by an all-reduce, in another order). The
         KV cache is sharded along its heads, the embedding along the
         vocabulary (an exact lookup), and norms and the vocabulary head are
         replicated (every device holds the full logits, so sampling needs
         no communication).

  experts  (MoE layers) the expert stacks are split over "model" along their
         expert axis and never move: each device routes its own rows, runs
         its experts on them and keeps the (token, slot) pairs routed to
         its experts, the others -0.0; a psum over "model" then gives every
         pair its one device's value exactly (v + -0.0 = v), before the
         same fixed-order sum over a token's experts one device runs
         (model/moe.py); the shared experts split like the MLP.

`param_spec` gives a parameter its PartitionSpec from the role its model
part declared (roles.py); `shard_params` and
`checkpoint.load(mesh=...)` place weights with it; `use(mesh)` makes the mesh
the context of a traced decode, where `ops` runs the Pallas kernels per shard
through `shard_map` (each kernel sees its own rows and heads).

Several processes (hosts): `initialize_distributed` starts
`jax.distributed` from the environment; meshes are built from each
process's local devices, and evaluation splits problems across processes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import jax
import numpy as np
from flax import traverse_util
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flash_dllm_jax import roles

AXES = ("data", "model")
CACHE_SPEC = P("data", None, "model", None)  # KV cache [B, S, K, D]
HEADS_SPEC = CACHE_SPEC                      # q / k / v [B, Q, H or K, D]

def parse_mesh(spec: str | Mesh | None) -> Mesh | None:
  """'data=4', 'model=2' or 'data=2,model=2' -> a Mesh over the first local
  devices (axes ("data", "model"); an absent axis has size 1)."""
  if spec is None or isinstance(spec, Mesh):
    return spec
  sizes = {}
  for part in spec.split(","):
    name, _, value = part.partition("=")
    name = name.strip()
    if (name not in AXES or name in sizes or not value.strip().isdigit()
        or int(value) < 1):
      raise ValueError(f"bad mesh spec {spec!r}: expected e.g. 'data=4' or "
                       f"'data=2,model=2' with axes from {AXES} (each at most "
                       "once) and positive sizes")
    sizes[name] = int(value)
  data, model = sizes.get("data", 1), sizes.get("model", 1)
  devices = jax.local_devices()
  if data * model > len(devices):
    raise ValueError(f"mesh {spec!r} asks for {data * model} devices, "
                     f"{len(devices)} present")
  grid = np.array(devices[:data * model]).reshape(data, model)
  try:
    from jax.sharding import AxisType
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 2)
  except (ImportError, TypeError):  # JAX without axis types: always auto
    return Mesh(grid, AXES)


def data_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else mesh.shape["data"]


def model_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else mesh.shape["model"]


def check_config(config, mesh: Mesh | None) -> None:
  """Clear error when the model cannot be split `model` ways."""
  m = model_size(mesh)
  if m == 1:
    return
  sizes = [("n_heads", config.n_heads), ("n_kv_heads", config.n_kv_heads),
           ("mlp_hidden", config.mlp_hidden)]
  if hasattr(config, "mesh_divisors"):  # a family with its own divisors
    sizes = config.mesh_divisors()
  elif getattr(config, "moe", None) is not None:
    sizes += [("moe.n_experts", config.moe.n_experts)]
    if config.moe.n_shared:
      sizes += [("shared experts' width",
                 config.moe.n_shared * config.moe.hidden)]
  bad = [f"{name}={value}" for name, value in sizes if value % m]
  if bad:
    common = np.gcd.reduce([value for _, value in sizes])
    raise ValueError(f"mesh model={m} must divide the attention heads, the "
                     f"KV heads, the MLP widths and the experts; this model "
                     f"has {', '.join(bad)} (model= must divide {common})")


def param_spec(config, path: str, shape: tuple[int, ...],
               mesh: Mesh | None = None) -> P:
  """The PartitionSpec of `config`'s parameter `path` ('layers_3/q_proj/
  kernel', or an 8-bit 'kernel_q' / 'scale') of stored `shape`."""
  role, quantized = roles.role_of(config, path)
  axes = role.axes(len(shape), quantized)
  if mesh is not None:  # a dimension the mesh does not divide stays whole
    for dim, axis in zip(shape, axes):
      if axis is not None and dim % mesh.shape[axis]:
        return P()
  return P(*axes) if any(axes) else P()


def _flat(params) -> dict[str, Any]:
  return traverse_util.flatten_dict(dict(params), sep="/")


def param_shardings(mesh: Mesh, config, params) -> Any:
  """A tree like `params` (arrays or shape structs) of NamedShardings."""
  return traverse_util.unflatten_dict(
      {path: NamedSharding(mesh, param_spec(config, path, tuple(x.shape),
                                            mesh))
       for path, x in _flat(params).items()}, sep="/")


def shard_params(mesh: Mesh, config, params) -> Any:
  """Places every weight on its shards (a no-op for weights already there)."""
  return jax.tree.map(lambda x, s: x if getattr(x, "sharding", None) == s
                      else jax.device_put(x, s),
                      params, param_shardings(mesh, config, params))


def shard_rows(mesh: Mesh, x):
  """Places an array (or PRNG key array) split along its first axis."""
  return jax.device_put(x, NamedSharding(mesh, P("data")))


def replicate(mesh: Mesh, tree):
  return jax.device_put(tree, NamedSharding(mesh, P()))


@contextlib.contextmanager
def use(mesh: Mesh | None) -> Iterator[None]:
  """Makes `mesh` the context of what is traced inside (nothing for None).
  The context mesh is part of jit's cache key."""
  if mesh is None:
    yield
    return
  set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
  with set_mesh(mesh):
    yield


def active_mesh():
  """The context mesh while tracing under `use`, if it has > 1 device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.size == 1 or set(
      mesh.axis_names) != set(AXES):
    return None
  return mesh


def constrain(x, spec: P):
  """with_sharding_constraint under an active mesh, identity otherwise."""
  if active_mesh() is None:
    return x
  return jax.lax.with_sharding_constraint(x, spec)


def shard_map(fn, mesh, in_specs, out_specs):
  """jax.shard_map where it exists (JAX >= 0.7), else the experimental one;
  replication is not checked (the kernels are opaque to the checker)."""
  if hasattr(jax, "shard_map"):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map as legacy
  return legacy(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                check_rep=False)


# ----------------------------------------------------------- several hosts

def initialize_distributed() -> bool:
  """Starts jax.distributed when the environment describes several
  processes; returns whether it did. Call before any other JAX work.

  JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and
  JAX_PROCESS_ID configure it explicitly; under Slurm or Open MPI with more
  than one task JAX detects them itself. Otherwise: one process, no-op.
  """
  if jax.distributed.is_initialized():
    return True
  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
               if not env.get(v, "").isdigit()]
    if missing:
      raise ValueError("JAX_COORDINATOR_ADDRESS is set but "
                       f"{' and '.join(missing)} not (integers expected)")
    jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"],
                               num_processes=int(env["JAX_NUM_PROCESSES"]),
                               process_id=int(env["JAX_PROCESS_ID"]))
    return True
  slurm = "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1
  ompi = ("OMPI_MCA_orte_hnp_uri" in env
          and int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1)
  if slurm or ompi:
    jax.distributed.initialize()
    return True
  return False


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (no-op for one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
