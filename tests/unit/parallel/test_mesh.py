"""Mesh shapes: a free axis takes the devices left; a shape that does not fit is named."""

import jax
import pytest

from transformer_jax.errors import ConfigError
from transformer_jax.parallel import mesh as sharding


def test_mesh_shape_resolution_and_errors():
  assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  with pytest.raises(ConfigError, match=r"mesh_shape=\(3, 1, 1\) does not fit the 8"):
    sharding.resolve_mesh_shape((3, 1, 1), 8)


def test_hosts_span_the_outermost_axes_that_divide_them():
  assert sharding.host_split((4, 8, 1), 2) == (2, 1, 1)   # data across hosts, FSDP within
  assert sharding.host_split((1, 16, 1), 2) == (1, 2, 1)  # FSDP only: across and within
  assert sharding.host_split((2, 4, 2), 8) == (2, 4, 1)   # tensor stays inside a host
  assert sharding.host_split((3, 4, 1), 8) is None        # 8 hosts cannot split (3, 4, 1)


def test_cpu_devices_keep_their_order():
  devices = jax.devices()
  grid = sharding.device_grid((len(devices), 1, 1), devices)
  assert grid.shape == (len(devices), 1, 1) and list(grid.ravel()) == devices
