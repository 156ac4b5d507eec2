"""Device mesh, logical-axis rules, multi-host start-up and placement of host batches.

The mesh has axes (data, fsdp, tensor). Parameters carry logical axis names; the rule table
maps each name to a mesh axis (or None: replicated). Batches are split over data and fsdp.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
DEFAULT_AXIS_RULES = (("embed", "fsdp"), ("vocab", "tensor"), ("heads", "tensor"),
                      ("mlp", "tensor"), ("kv", None), ("layers", None))


@dataclasses.dataclass(frozen=True)
class ParallelismConfig:
  """Mesh shape and logical-axis rules; built from `config.parallelism`."""
  mesh_shape: tuple[int, ...] = (-1, 1, 1)  # (data, fsdp, tensor); one -1 takes the rest
  # (logical axis, mesh axis or None = replicated). The defaults give every strategy by mesh
  # shape alone: the d_model axis of each parameter (and its optimizer state) split over
  # `fsdp` (FSDP / ZeRO-3: gathered for each matmul), heads, FFN width and vocabulary over
  # `tensor` (Megatron-style tensor parallelism). With fsdp = tensor = 1 (the default mesh)
  # this is plain data parallelism.
  axis_rules: tuple[tuple[str, str | None], ...] = DEFAULT_AXIS_RULES

  def __post_init__(self):
    object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
    object.__setattr__(self, "axis_rules", tuple(tuple(r) for r in self.axis_rules))
    if len(self.mesh_shape) != len(MESH_AXES):
      raise ValueError(f"config.parallelism.mesh_shape={self.mesh_shape} needs "
                       f"{len(MESH_AXES)} entries {MESH_AXES}")
    if list(self.mesh_shape).count(-1) > 1:
      raise ValueError(f"config.parallelism.mesh_shape={self.mesh_shape}: at most one -1")
    for name, axis in self.axis_rules:
      if axis is not None and axis not in MESH_AXES:
        raise ValueError(f"config.parallelism.axis_rules maps {name!r} to unknown mesh axis "
                         f"{axis!r}; expected one of {MESH_AXES} or None")


def resolve_mesh_shape(mesh_shape, num_devices: int) -> tuple[int, ...]:
  """Replaces -1 by what is left of the devices; checks the product is the device count."""
  known = math.prod(d for d in mesh_shape if d != -1)
  shape = tuple(num_devices // known if d == -1 else d for d in mesh_shape)
  if math.prod(shape) != num_devices or known <= 0:
    raise ValueError(f"config.parallelism.mesh_shape={tuple(mesh_shape)} does not fit the "
                     f"{num_devices} available devices")
  return shape


def make_mesh(cfg: ParallelismConfig, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(cfg.mesh_shape, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def round_up_to_data_parallel(batch_size: int, mesh: Mesh) -> int:
  """The smallest multiple of the data-parallel size that holds `batch_size` rows."""
  dp = data_parallel_size(mesh)
  return -(-batch_size // dp) * dp


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def logical_to_mesh(boxed_tree, mesh: Mesh, rules):
  """NamedShardings for a tree of (possibly logically-annotated) arrays."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def indivisible(abstract_tree, shardings) -> list[str]:
  """Array dimensions that the mesh axes they are split over do not divide: one message per
  distinct (size, mesh axis), with the first array it affects."""
  problems: dict[tuple, str] = {}
  flat, _ = jax.tree_util.tree_flatten_with_path(abstract_tree)
  flat_shardings = jax.tree_util.tree_leaves(shardings)
  for (path, leaf), named in zip(flat, flat_shardings):
    for dim, axes in zip(leaf.shape, named.spec):
      axes = (axes,) if isinstance(axes, str) else (axes or ())
      size = math.prod(named.mesh.shape[a] for a in axes)
      if dim % size and (dim, axes) not in problems:
        problems[(dim, axes)] = (f"{dim} is not divisible by mesh axis {'x'.join(axes)} of size "
                                 f"{size} (e.g. {jax.tree_util.keystr(path)}, shape "
                                 f"{tuple(leaf.shape)})")
  return list(problems.values())


def split_interleaved(x, k: int):
  """(N, ...) -> (k, N/k, ...) with row r in piece r % k: with the rows split over devices in
  contiguous blocks, every piece keeps rows on every device (micro-batches, loss chunks)."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def merge_interleaved(x):
  """The inverse of `split_interleaved`."""
  return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def global_batch(host_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each host's rows into global arrays split over the batch mesh axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in host_batch.items()}


def global_array_from_full(array: np.ndarray, mesh: Mesh) -> jax.Array:
  """A global array split over the batch axes, from a full copy held by every host."""
  return jax.make_array_from_callback(array.shape, batch_sharding(mesh), lambda idx: array[idx])


def fetch(array: jax.Array) -> np.ndarray:
  """The whole value of a (possibly multi-host) global array, on every host."""
  if jax.process_count() > 1 and not array.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(jax.device_get(array))


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None):
  """Starts jax.distributed for multi-host runs: explicit flags, or JAX's own detection on
  TPU pods and SLURM clusters (`JAX_COORDINATOR_ADDRESS` etc.). A no-op on one process."""
  import os
  explicit = coordinator_address is not None
  detected = any(k in os.environ for k in ("SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES",
                                           "JAX_COORDINATOR_ADDRESS"))
  if explicit:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif detected and (num_processes or 0) != 1:
    jax.distributed.initialize()
