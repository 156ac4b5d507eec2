"""A population: K members of one config that differ in values that change no array's shape
(`config.population`), trained as one program on the same batches. The train state is stacked
on a leading member axis and the step `vmap`ped over it; each member's values are traced
arrays of that axis, so K learning rates, dropout rates or seeds compile once.

On a mesh the member axis is not split: every member's arrays are laid out as the axis rules
lay out a single run's, and the batch, shared by all members, is split as a single run's is
(the data-parallel all-reduce carries K members' gradients at once).

A member stops (early stopping; a non-finite update under nonfinite_updates="stop") by a mask
in the state, not by a recompile: its state is frozen where it stopped, step counter included.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.config.checks import check_type
from transformer_jax.config.population import MEMBER_KEYS, SWITCHES
from transformer_jax.config.sections import SECTIONS, TrainConfig
from transformer_jax.errors import ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.dropout import TracedRate
from transformer_jax.ops.platform import traced_for
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training.optimizer import make_optimizer
from transformer_jax.training.state import state_init
from transformer_jax.training.step import train_step


class PopulationState(struct.PyTreeNode):
  """The members' train states stacked on a leading axis, and which of them still train."""
  members: object  # TrainState (or EmaTrainState), each array with a leading member axis
  active: jax.Array  # (K,) bool

  @property
  def step(self):
    """The population's step: that of its members still training (all advance together)."""
    return jnp.max(self.members.step)


def varying_keys(cfg: TrainConfig) -> tuple[str, ...]:
  """The MEMBER_KEYS the population gives values for ("seed" for seeds=N)."""
  pop = cfg.population
  return tuple(key for key in MEMBER_KEYS
               if getattr(pop, key) or (key == "seed" and pop.seeds))


def member_configs(cfg: TrainConfig) -> list[TrainConfig]:
  """Each member's config as a run of its own would have it: the member's values set (and
  checked as any config's), the population's data order (`data_seed`), no population. A
  run of that config alone trains what the member trains."""
  pop = cfg.population
  members = []
  for i in range(pop.size):
    changes = {}
    for key in varying_keys(cfg):
      path = MEMBER_KEYS[key]
      value = cfg.seed + i if key == "seed" and pop.seeds else getattr(pop, key)[i]
      changes[path] = check_type(f"config.population.{key}[{i}]", value, _field_type(path))
    try:
      members.append(_replaced(cfg, changes))
    except ConfigError as e:
      raise ConfigError(f"config.population, member {i}: {e}") from None
  for key, what in SWITCHES.items():
    on = {getattr(m.optimizer, key) > 0 for m in members}
    if len(on) > 1:
      raise ConfigError(f"config.population.{key}={getattr(pop, key)}: 0 turns {what} off, "
                        "another program; give all members values > 0, or all 0")
  return members


def _field_type(path: str):
  """The type of dotted config key `path`'s field."""
  *sections, name = path.split(".")
  cls = TrainConfig
  for section in sections:
    cls = SECTIONS[section]
  return typing.get_type_hints(cls)[name]


def _replaced(cfg: TrainConfig, changes: dict) -> TrainConfig:
  """`cfg` with dotted keys set, checked, as a single run's config."""
  sections = {}
  run_level = {"data_seed": cfg.batch_seed, "population": dataclasses.replace(
      cfg.population, seeds=0, **{key: () for key in MEMBER_KEYS})}
  for path, value in changes.items():
    section, _, key = path.rpartition(".")
    if section:
      sections.setdefault(section, {})[key] = value
    else:
      run_level[key] = value
  return dataclasses.replace(cfg, **run_level, **{
      name: dataclasses.replace(getattr(cfg, name), **values)
      for name, values in sections.items()})


# The member keys that are dropout rates (traced as the numbers Dropout takes from a rate).
DROPOUT_KEYS = ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate")


@dataclasses.dataclass(frozen=True)
class Population:
  """A run's members: their configs, and the values a step traces (for each varying key but
  the seed, the members' values (K,): a dropout rate as the keep threshold and scale its run
  alone takes from it (`TracedRate`), any other in float32, whatever the key's type)."""
  members: tuple[TrainConfig, ...]
  values: dict

  @classmethod
  def of(cls, cfg: TrainConfig) -> Population:
    members = tuple(member_configs(cfg))
    values = {key: [config_value(m, MEMBER_KEYS[key]) for m in members]
              for key in varying_keys(cfg) if key != "seed"}
    return cls(members, {key: TracedRate.of(v) if key in DROPOUT_KEYS
                         else np.asarray(v, np.float32) for key, v in values.items()})

  @property
  def size(self) -> int:
    return len(self.members)

  @property
  def base(self) -> TrainConfig:
    """What every member shares (member 0's config; the traced values replace its own)."""
    return self.members[0]


def config_value(cfg, path: str):
  """The value of dotted config key `path` ("optimizer.learning_rate")."""
  for part in path.split("."):
    cfg = getattr(cfg, part)
  return cfg


def traced_config(cfg: TrainConfig, values: dict) -> TrainConfig:
  """`cfg` with one member's traced values set where MEMBER_KEYS says, unchecked (a traced
  value cannot be compared): for tracing only, never saved."""
  cfg = copy.copy(cfg)
  for key, value in values.items():
    *sections, name = MEMBER_KEYS[key].split(".")
    node = cfg
    for section in sections:
      child = copy.copy(getattr(node, section))
      object.__setattr__(node, section, child)
      node = child
    object.__setattr__(node, name, value)
  return cfg


def member_rngs(pop: Population) -> tuple[jax.Array, jax.Array]:
  """(initialisation keys, dropout keys) (K, 2): member i's as a run of its own draws them."""
  keys = [jax.random.split(jax.random.PRNGKey(m.seed)) for m in pop.members]
  return jnp.stack([k[0] for k in keys]), jnp.stack([k[1] for k in keys])


def stacked_sharding(member_sharding, mesh):
  """A member's shardings with the member axis in front, not split."""
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, P(None, *s.spec)),
                                member_sharding)


def population_init(pop: Population, mesh):
  """(init(keys (K, 2)) -> PopulationState, its shardings); a ConfigError for a mesh that
  cannot split a member's parameters."""
  init, member_sharding = state_init(pop.base, Transformer(pop.base.model), mesh)
  sharding = PopulationState(stacked_sharding(member_sharding, mesh),
                             mesh_lib.replicated(mesh))

  def population(keys):
    members = jax.vmap(lambda key: nn.meta.unbox(init(key)))(keys)
    return PopulationState(members, jnp.ones(keys.shape[0], bool))
  return jax.jit(population, out_shardings=sharding), sharding


def population_step(state: PopulationState, batch, rngs, lr_scale=1.0, *, pop: Population,
                    mesh=None, nonfinite_at_step: int = 0, param_shardings=None):
  """`train_step` of every member on the same batch, each with its own values and dropout
  key; a member not active is left as it is. Returns the new state and each member's metric
  sums (K,). `param_shardings`: a member's, when `fsdp` splits them (`train_step`'s)."""
  cfg = pop.base
  skip_nonfinite = cfg.nonfinite_updates == "skip"

  def member(state, rng, active, vals):
    mcfg = traced_config(cfg, vals)
    new, metrics = train_step(
        state, batch, rng, lr_scale, model=Transformer(mcfg.model),
        label_smoothing=mcfg.label_smoothing, num_micro_batches=cfg.num_micro_batches,
        nonfinite_at_step=nonfinite_at_step, mesh=mesh, param_shardings=param_shardings,
        tx=make_optimizer(mcfg.optimizer, cfg.num_train_steps),
        ema_decay=mcfg.optimizer.ema_decay if cfg.optimizer.ema_decay else None)
    new = jax.tree_util.tree_map(lambda n, o: jnp.where(active, n, o), new, state)
    finite = metrics["nonfinite_steps"] == 0
    metrics = {k: jnp.where(active, v, jnp.inf if k == "first_nonfinite_step" else 0.0)
               for k, v in metrics.items()}
    return new, active & (finite | skip_nonfinite), metrics

  args = (state.members, rngs, state.active, pop.values)
  if member_program(pop.base) == "vmapped":
    members, active, metrics = jax.vmap(member)(*args)
  else:  # (each member's step as a run of its own compiles it, side by side in one program;
    # a conditional skips a stopped member's: on a CPU it costs nothing)
    def stopped(state, rng, active, vals):
      shapes = jax.eval_shape(member, state, rng, active, vals)[2]
      return state, active, {k: jnp.full(v.shape, jnp.inf if k == "first_nonfinite_step"
                                         else 0, v.dtype) for k, v in shapes.items()}
    steps = [jax.lax.cond(args[2][k], member, stopped,
                          *jax.tree_util.tree_map(lambda x, k=k: x[k], args))
             for k in range(pop.size)]
    members, active, metrics = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *steps)
  return PopulationState(members, active), metrics


def member_program(cfg: TrainConfig) -> str:
  """How the members' steps make one program (config.population.program): "vmapped" (the
  member axis a batch axis of every operation: one step's body to compile, and on GPUs and
  TPUs batched matmuls), or "unrolled" (K copies of a single run's step side by side: each
  member's matmuls as a run alone runs them; XLA:CPU runs batched matmuls slower per member
  than plain ones). "auto": unrolled on CPU, vmapped elsewhere."""
  program = cfg.population.program
  if program == "auto":
    return "unrolled" if traced_for() == "cpu" else "vmapped"
  return program


def compile_population_step(pop: Population, mesh, sharding, nonfinite_at_step: int = 0):
  """`population_step` jitted over `mesh` as `step.compile_step` jits a single run's:
  (state, batch, rngs[, lr_scale]) -> (state, metric sums (K,)), the state donated."""
  replicated = mesh_lib.replicated(mesh)
  lr_scale_sharding = (replicated,) if pop.base.optimizer.cooldown_fraction > 0 else ()
  member_params = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, P(*s.spec[1:])),
                                         sharding.members.params)
  return jax.jit(
      functools.partial(population_step, pop=pop, mesh=mesh,
                        nonfinite_at_step=nonfinite_at_step,
                        param_shardings=member_params if mesh.shape["fsdp"] > 1 else None),
      in_shardings=(sharding, mesh_lib.batch_sharding(mesh), replicated, *lr_scale_sharding),
      out_shardings=(sharding, replicated),
      donate_argnums=(0,))


def member_state(state: PopulationState, i: int):
  """Member i's train state, as a run of its own holds it."""
  return jax.tree_util.tree_map(lambda x: x[i], state.members)
