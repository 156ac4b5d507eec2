"""Mesh shapes: a free axis takes the devices left; a shape that does not fit is named."""

import pytest

from transformer_jax.errors import ConfigError
from transformer_jax.parallel import mesh as sharding


def test_mesh_shape_resolution_and_errors():
  assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  with pytest.raises(ConfigError, match=r"mesh_shape=\(3, 1, 1\) does not fit the 8"):
    sharding.resolve_mesh_shape((3, 1, 1), 8)
