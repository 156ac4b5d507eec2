"""Data parallelism on 8 fake CPU devices gives the same training as one device."""

import json
import os
import subprocess
import sys

import pytest

from transformer_jax import sharding
from tests.conftest import ROOT

SCRIPT = r"""
import functools, json, sys
import jax, numpy as np
sys.path.insert(0, ".")
from tests.test_train_lib import tiny_setup, fixed_batch
from transformer_jax import sharding, train_lib

assert jax.device_count() == 8, jax.devices()
cfg, model, _ = tiny_setup()
results = {}
for name, devices in (("1", jax.devices()[:1]), ("8", jax.devices())):
  mesh = sharding.make_mesh(cfg.parallelism, devices)
  state, state_sharding = train_lib.create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(train_lib.train_step, model=model, label_smoothing=0.1),
                 in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=(state_sharding, sharding.replicated(mesh)))
  losses = []
  for i in range(3):
    batch = sharding.global_batch(fixed_batch(seed=i), mesh)
    assert len(batch["inputs"].sharding.device_set) == len(devices)
    state, m = step(state, batch, jax.random.PRNGKey(7))
    losses.append(float(m["loss_sum"] / m["num_tokens"]))
  results[name] = losses
print(json.dumps(results))
"""


def test_eight_devices_match_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads(r.stdout.strip().splitlines()[-1])
  assert results["1"] == pytest.approx(results["8"], rel=1e-5)
  assert results["1"][2] < results["1"][0]


def test_mesh_shape_resolution_and_errors():
  assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  with pytest.raises(ValueError, match=r"mesh_shape=\(3, 1, 1\) does not fit the 8"):
    sharding.resolve_mesh_shape((3, 1, 1), 8)
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.ParallelismConfig(mesh_shape=(-1, -1, 1))
