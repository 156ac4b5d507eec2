"""The train state (step, parameters, optimizer state, and the parameters' moving average when
configured), initialised or described on the mesh with each array sharded by the logical-axis
rules."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from flax.training import train_state

from transformer_jax.config.sections import TrainConfig
from transformer_jax.errors import ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training.optimizer import make_optimizer


class TrainState(train_state.TrainState):
  """Step, parameters and optimizer state (apply_fn and tx are static)."""

  @property
  def eval_params(self):
    """What validation, the test and the tools translate with."""
    return self.params


class EmaTrainState(TrainState):
  """A TrainState with `ema_params`, the exponential moving average of the parameters
  (config.optimizer.ema_decay > 0; Polyak averaging, Marian's --exponential-smoothing),
  sharded like them and saved with them: ema(t) = d(t) * ema(t-1) + (1 - d(t)) * params(t)
  from the initial parameters, d(t) = min(decay, (1 + t) / (10 + t)) (step.ema_decay_at).
  (A class of its own: the states, and so the checkpoints, of runs without it stay what they
  were.)"""
  ema_params: Any = None
  ema_decay: float = struct.field(pytree_node=False, default=0.0)

  @property
  def eval_params(self):
    return self.ema_params


def state_init(cfg: TrainConfig, model: Transformer, mesh):
  """(init(rng) -> boxed TrainState, the state's shardings on `mesh`); a ConfigError when the
  mesh cannot split the parameters evenly (checked before anything is compiled)."""
  init, state_sharding, _ = _described(cfg, model, mesh)
  return init, state_sharding


def _described(cfg: TrainConfig, model: Transformer, mesh):
  """`state_init`'s two, and the boxed state's shapes (one trace of the model's init)."""
  tx = make_optimizer(cfg.optimizer, cfg.num_train_steps)
  dummy = np.ones((1, 8), np.int32)  # (numpy, and a key's shape below: no op to compile)

  def init(rng):
    variables = model.init(rng, dummy, dummy)
    if cfg.optimizer.ema_decay:
      return EmaTrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                                  ema_params=variables["params"],
                                  ema_decay=cfg.optimizer.ema_decay)
    return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)

  boxed = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
  state_sharding = mesh_lib.logical_to_mesh(boxed, mesh, cfg.parallelism.axis_rules)
  problems = mesh_lib.indivisible(nn.meta.unbox(boxed), state_sharding)
  if problems:
    raise ConfigError(f"config.parallelism: mesh {dict(mesh.shape)} and its axis rules cannot "
                      "split the model's parameters evenly: " + "; ".join(problems)
                      + ". Change config.parallelism.mesh_shape, the axis rules or the sizes.")
  return init, state_sharding, boxed


def create_state(cfg: TrainConfig, model: Transformer, mesh, rng):
  """Initialised TrainState, laid out on the mesh by the logical-axis rules, and its
  shardings."""
  init, state_sharding = state_init(cfg, model, mesh)
  return initialise(init, state_sharding, rng), state_sharding


def initialise(init, state_sharding, rng):
  """The state `init` makes, computed directly in its shardings."""
  return jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=state_sharding)(rng)


def abstract_state(cfg: TrainConfig, model: Transformer, mesh):
  """Shapes, dtypes and shardings of the TrainState, without computing it (restore target)."""
  _, state_sharding, boxed = _described(cfg, model, mesh)
  shapes = nn.meta.unbox(boxed)
  return jax.tree_util.tree_map(
      lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes, state_sharding)


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))

