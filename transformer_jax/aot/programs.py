"""The programs a run executes, lowered for a mesh of devices that need not be present: the
train step, the validation loss step, and beam search in flight (new sentences encoded into
slots, the search loop).
Arguments are `ShapeDtypeStruct`s with the shardings the run gives its arrays, so the
compiler partitions the programs exactly as it would for the run.

A program with loops is also given its "twin": the same arithmetic without loops (the fused
loss in one tile, layers not scanned, one micro-batch of the batch's 1/k, one step of every
slot), for
which the TPU compiler's cost estimate is sound (it counts a loop's body once)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from transformer_jax.aot import flops
from transformer_jax.config.sections import TrainConfig
from transformer_jax.decoding import ensemble
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.evaluation.evaluator import eval_step
from transformer_jax.model.embeddings import compute_dtype
from transformer_jax.model.stepwise import StepwiseModel
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.platform import tracing_for
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training import population
from transformer_jax.training.state import abstract_state
from transformer_jax.training.step import compile_step

TRAIN_KEYS = ("inputs", "targets", "inputs_positions", "targets_positions",
              "inputs_segment_ids", "targets_segment_ids")


@dataclasses.dataclass(frozen=True)
class Program:
  name: str
  lower: Callable[[], jax.stages.Lowered]          # the program the run executes
  twin: Callable[[], jax.stages.Lowered] | None    # its arithmetic without loops
  twin_runs: int            # runs of the twin per run of the program
  model_flops: int          # per run (or per decoding step), all devices together
  tokens: int               # target tokens per run (beam: hypotheses advanced per step)
  per: str                  # "step" or "decoding step"


def _for_devices(lower, mesh):
  """`lower` traced for the platform of the mesh's devices (ops.platform), not this
  process's."""
  @functools.wraps(lower)
  def traced():
    with tracing_for(mesh.devices.flat[0].platform):
      return lower()
  return traced


def _sds(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _shardings(tree):
  return jax.tree_util.tree_map(lambda x: x.sharding, tree)


def train_program(cfg: TrainConfig, mesh) -> Program:
  rows, k = cfg.data.batch_size, cfg.num_micro_batches
  S, T = cfg.data.max_source_length, cfg.data.max_target_length
  twin_cfg = dataclasses.replace(
      cfg, num_micro_batches=1, data=dataclasses.replace(cfg.data, batch_size=rows // k),
      model=dataclasses.replace(cfg.model, loss_tile_tokens=0, scan_layers=False))
  members = max(cfg.population.size, 1)  # (a population: K members' steps in one program)
  return Program("train_step", _for_devices(functools.partial(_lower_train, cfg, mesh), mesh),
                 _for_devices(functools.partial(_lower_train, twin_cfg, mesh), mesh), k,
                 members * flops.train_step(cfg.model, rows, S, T), members * rows * T, "step")


def _lower_train(cfg: TrainConfig, mesh) -> jax.stages.Lowered:
  if cfg.population.size:
    state, step, rng_shape = _population_step(cfg, mesh)
  else:
    model = Transformer(cfg.model)
    state = abstract_state(cfg, model, mesh)
    step, rng_shape = compile_step(cfg, model, mesh, _shardings(state)), (2,)
  rows = cfg.data.batch_size
  batch = {key: _sds((rows, cfg.data.max_target_length if key.startswith("targets")
                      else cfg.data.max_source_length), jnp.int32,
                     mesh_lib.batch_sharding(mesh)) for key in TRAIN_KEYS}
  scalars = (_sds(rng_shape, jnp.uint32, mesh_lib.replicated(mesh)),)
  if cfg.optimizer.cooldown_fraction > 0:
    scalars += (_sds((), jnp.float32, mesh_lib.replicated(mesh)),)
  return step.lower(state, batch, *scalars)


def _population_step(cfg: TrainConfig, mesh):
  """(the population's abstract state, its step, the shape of its dropout keys)."""
  pop = population.Population.of(cfg)
  init, sharding = population.population_init(pop, mesh)
  shapes = jax.eval_shape(init, jax.ShapeDtypeStruct((pop.size, 2), jnp.uint32))
  state = jax.tree_util.tree_map(lambda x, s: _sds(x.shape, x.dtype, s), shapes, sharding)
  return state, population.compile_population_step(pop, mesh, sharding), (pop.size, 2)


def _decode_rows(cfg: TrainConfig, mesh) -> int:
  return mesh_lib.round_up_to_data_parallel(cfg.decode.batch_size, mesh)


def eval_program(cfg: TrainConfig, mesh) -> Program:
  rows, S, T = _decode_rows(cfg, mesh), cfg.data.max_source_length, cfg.data.max_target_length

  def lower():
    model = Transformer(cfg.model)
    params = abstract_state(cfg, model, mesh).params
    batch = {key: _sds((rows, T if key == "targets" else S), jnp.int32,
                       mesh_lib.batch_sharding(mesh)) for key in ("inputs", "targets")}
    return jax.jit(functools.partial(eval_step, model=model)).lower(params, batch)

  return Program("eval_step", _for_devices(lower, mesh), None, 1,
                 flops.forward(cfg.model, rows, S, T), rows * T, "step")


def decoding_model(cfg: TrainConfig, mesh) -> StepwiseModel:
  """The model as the search receives it (`decoding.ensemble.prepare`: the per-layer layout,
  the kernels in the compute dtype, the output matrix prepared), its parameters abstract and
  placed on `mesh`."""
  model_cfg = dataclasses.replace(cfg.model, scan_layers=False)
  model = Transformer(model_cfg)
  placed = abstract_state(dataclasses.replace(cfg, model=model_cfg), model, mesh).params
  dtype = jnp.dtype(compute_dtype(model_cfg))
  cast, prepared = jax.eval_shape(functools.partial(ensemble.decoding_variables, dtype=dtype),
                                  placed)
  params = jax.tree_util.tree_map(lambda x, p: _sds(x.shape, x.dtype, p.sharding), cast, placed)
  whole = mesh_lib.replicated(mesh)
  prepared = jax.tree_util.tree_map(lambda x: _sds(x.shape, x.dtype, whole), prepared)
  return StepwiseModel(model, params, prepared)


def beam_programs(cfg: TrainConfig, mesh) -> list[Program]:
  """Beam search in flight as the decoding engine runs it (`SearchEngine.programs`) for a set
  decoded with the config's settings (validation, `evaluate`: the rules and sampling in only
  if they ask), at the width class of the config's longest source: "beam_advance" (new
  sentences encoded into slots, the search loop), whose twin is one step of every slot;
  figures per decoding step, the slots' cache at the class's length."""
  # (slots: the batch size on an accelerator, whatever this machine would choose)
  decode = dataclasses.replace(cfg.decode, slots=cfg.decode.slots or cfg.decode.batch_size)
  engine = SearchEngine(decoding_model(cfg, mesh), None, decode, mesh)
  decoder = engine.set_decoder()  # (the one `programs` lowers)
  g, W, m = decoder.geometry, decode.beam_size, cfg.model
  width_class = g.class_of(min(cfg.data.max_source_length, g.widths[-1]))
  lowered = {name: _for_devices(lower, mesh)
             for name, lower in engine.programs(width_class).items()}
  rows, S, C = g.slots * W, g.widths[width_class], g.capacities[width_class]
  return [Program("beam_advance", lowered["advance"], lowered["step"], 1,
                  flops.decoder_step(m, rows, S, C), rows, "decoding step")]
