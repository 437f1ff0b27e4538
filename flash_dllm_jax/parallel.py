"""Device meshes for data-parallel decoding through JAX's SPMD partitioner.

`--mesh data=D` splits the batch over D devices: prompts, padding masks and
PRNG keys are sharded along the batch, parameters are replicated, and the
compiled decode loop runs unchanged (rows are independent, so XLA partitions
it with no communication but the loop's "all rows done?" reduction).
Tensor parallelism (`model=M`) is not implemented yet.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "model")


def parse_mesh(spec: str | Mesh | None) -> Mesh | None:
  """'data=4' (or 'data=2,model=1') -> a Mesh over the first devices."""
  if spec is None or isinstance(spec, Mesh):
    return spec
  sizes = {}
  for part in spec.split(","):
    name, _, value = part.partition("=")
    name = name.strip()
    if name not in AXES or not value.strip().isdigit() or int(value) < 1:
      raise ValueError(f"bad mesh spec {spec!r}: expected e.g. 'data=4' with "
                       f"axes from {AXES} and positive sizes")
    sizes[name] = int(value)
  if sizes.get("model", 1) != 1:
    raise ValueError("tensor parallelism (model > 1) is not implemented yet")
  data = sizes.get("data", 1)
  devices = jax.devices()
  if data > len(devices):
    raise ValueError(f"mesh asks for {data} devices, {len(devices)} present")
  return Mesh(np.array(devices[:data]).reshape(data, 1), AXES)


def data_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else mesh.shape["data"]


def shard_rows(mesh: Mesh, x):
  """Places an array (or PRNG key array) split along its first axis."""
  return jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))


def replicate(mesh: Mesh, tree):
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))
