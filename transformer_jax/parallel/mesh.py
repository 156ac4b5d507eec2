"""The device mesh, parameter shardings from logical-axis rules, and batches placed on it.

The mesh has axes (data, fsdp, tensor). Parameters carry logical axis names; the rule table
(`config.parallelism.axis_rules`) maps each name to a mesh axis (or None: replicated). Batches
are split over data and fsdp; every host feeds its own rows.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.config.sections import MESH_AXES, ParallelismConfig
from transformer_jax.errors import ConfigError

BATCH_AXES = ("data", "fsdp")


def resolve_mesh_shape(mesh_shape, num_devices: int) -> tuple[int, ...]:
  """Replaces -1 by what is left of the devices; checks the product is the device count."""
  known = math.prod(d for d in mesh_shape if d != -1)
  shape = tuple(num_devices // known if d == -1 else d for d in mesh_shape)
  if math.prod(shape) != num_devices or known <= 0:
    raise ConfigError(f"config.parallelism.mesh_shape={tuple(mesh_shape)} does not fit the "
                      f"{num_devices} available devices")
  return shape


def make_mesh(cfg: ParallelismConfig, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(cfg.mesh_shape, len(devices))
  return Mesh(device_grid(shape, devices), MESH_AXES)


def host_split(shape: tuple[int, ...], num_hosts: int) -> tuple[int, ...] | None:
  """How many hosts each mesh axis spans, outermost axes first (data, then fsdp, then tensor),
  so that the inner axes' collectives stay within a host; None if the hosts do not divide."""
  split, left = [], num_hosts
  for size in shape:
    take = math.gcd(size, left)
    split.append(take)
    left //= take
  return tuple(split) if left == 1 else None


def device_grid(shape: tuple[int, ...], devices) -> np.ndarray:
  """The devices arranged for the interconnect. On accelerators: within a host by JAX's
  topology-aware `create_device_mesh` (TPU torus, GPU order), and across hosts along the
  outermost axes (`create_hybrid_device_mesh`: the slow links carry the data-parallel
  all-reduce). On CPU, and where JAX cannot place the shape, the devices in their order."""
  if devices[0].platform == "cpu":
    return np.asarray(devices).reshape(shape)
  num_hosts = len({d.process_index for d in devices})
  hosts = host_split(shape, num_hosts) if num_hosts > 1 else None
  try:
    if hosts is not None:
      within = tuple(size // h for size, h in zip(shape, hosts))
      return mesh_utils.create_hybrid_device_mesh(within, hosts, devices,
                                                  process_is_granule=True,
                                                  allow_split_physical_axes=True)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    return np.asarray(devices).reshape(shape)


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
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(jax.device_get(array))

