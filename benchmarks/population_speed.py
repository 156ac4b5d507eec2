"""A population's training speed against one run's: member-steps per second of K seeds
trained as one program (`config.population.seeds=K`), warm steps only, beside the train step
a single run compiles; compile time and peak memory apart.

  python benchmarks/population_speed.py --config=configs/tiny.py --sizes=1,2,4,8
  python benchmarks/population_speed.py --config=configs/default.py --sizes=1,2,4
  python benchmarks/population_speed.py --config=configs/tiny.py --sizes=4 --stopped=2

`--stopped=N`: the last N members of each population stopped (masked, as early stopping or a
sweep's pruner stops one) before timing: what a stopped member still costs. Member-steps
count the members still training.

The batch is synthetic and packed like the config's (measure.packed_batch). `--rounds`
alternates the single run and each population that many times; figures are medians of the
per-step times. Peak memory is the process's (host RSS on CPU, which only grows: read it in
the order the sizes run).
"""

import dataclasses
import statistics
import time

import jax
import numpy as np
from absl import app, flags
from measure import packed_batch, peak_memory_gb
from ml_collections import config_flags

from transformer_jax.config.parse import from_config_dict
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import hardware, numerics
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training import population as pl
from transformer_jax.training.state import create_state
from transformer_jax.training.step import compile_step

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/default.py", "Config to measure.")
flags.DEFINE_list("sizes", ["1", "2", "4", "8"], "Population sizes K.")
flags.DEFINE_integer("steps", 10, "Timed steps per round (after 2 warm-up steps).")
flags.DEFINE_integer("rounds", 2, "Alternating rounds over the single run and the sizes.")
flags.DEFINE_integer("stopped", 0, "Members of each population stopped before timing.")


def _with_seeds(cfg, k: int):
  dtype = numerics.resolve(cfg.model.dtype).dtype  # ("auto": what training picks)
  # (steps are timed here, not planned: a population's length is set)
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype),
                             num_train_steps=max(cfg.num_train_steps, 1),
                             population=dataclasses.replace(cfg.population, seeds=k))


def _single(cfg, mesh):
  """(state, step(state, batch, rng[, factor]), rng, [factor]) of a single run."""
  model = Transformer(cfg.model)
  state, sharding = create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  step = compile_step(cfg, model, mesh, sharding)
  return state, step, jax.random.PRNGKey(1), _cooldown_factor(cfg)


def _population(cfg, mesh):
  pop = pl.Population.of(cfg)
  init, sharding = pl.population_init(pop, mesh)
  init_keys, dropout_keys = pl.member_rngs(pop)
  state = init(init_keys)
  state = state.replace(active=jax.device_put(np.arange(pop.size) < pop.size - FLAGS.stopped,
                                              state.active.sharding))
  return (state, pl.compile_population_step(pop, mesh, sharding), dropout_keys,
          _cooldown_factor(cfg))


def _cooldown_factor(cfg) -> list:
  """The step's cooldown factor argument, which it takes only with a cooldown (1: none yet)."""
  return [np.float32(1.0)] * (cfg.optimizer.cooldown_fraction > 0)


def _timed(setup, batch, steps: int, store: dict):
  """Per-step seconds of `steps` warm steps (compiling and warming up the first time)."""
  if "step" not in store:
    t = time.perf_counter()
    state, step, rng, scale = setup()
    for _ in range(2):
      state, metrics = step(state, batch, rng, *scale)
    jax.block_until_ready(metrics)
    store.update(state=state, step=step, rng=rng, scale=scale,
                 compile_s=time.perf_counter() - t, times=[])
  state, step, rng = store["state"], store["step"], store["rng"]
  scale = store["scale"]
  for _ in range(steps):
    t = time.perf_counter()
    state, metrics = step(state, batch, rng, *scale)
    jax.block_until_ready(metrics)
    store["times"].append(time.perf_counter() - t)
  store["state"] = state


def main(_):
  base = from_config_dict(FLAGS.config)
  sizes = [int(k) for k in FLAGS.sizes]
  mesh = mesh_lib.make_mesh(base.parallelism)
  batch = packed_batch(base.data.batch_size, base.data.max_source_length,
                       base.model.vocab_size, np.random.default_rng(0))
  batch = mesh_lib.global_batch(batch, mesh)
  print(hardware.describe_machine(), flush=True)
  single_cfg = _with_seeds(base, 0)
  runs = {"single run": (lambda: _single(single_cfg, mesh), 1)}
  for k in sizes:
    cfg = _with_seeds(base, k)
    runs[f"K={k}"] = (lambda cfg=cfg: _population(cfg, mesh), k - FLAGS.stopped)
  stores = {name: {} for name in runs}
  memory = {}
  for _ in range(FLAGS.rounds):
    for name, (setup, _k) in runs.items():
      _timed(setup, batch, FLAGS.steps, stores[name])
      memory.setdefault(name, peak_memory_gb())
  one = statistics.median(stores["single run"]["times"])
  print(f"config {base.model.dtype} -> {single_cfg.model.dtype}, batch "
        f"{base.data.batch_size} rows x {base.data.max_target_length}, {FLAGS.rounds} rounds "
        f"x {FLAGS.steps} steps; program {pl.member_program(_with_seeds(base, 2))}, "
        f"{FLAGS.stopped} member(s) of each population stopped")
  print("| run | step (ms) | member-steps/s | vs a single run | compile (s) | peak memory "
        "(GiB) |")
  print("|---|---|---|---|---|---|")
  for name, (_setup, k) in runs.items():
    step_s = statistics.median(stores[name]["times"])
    print(f"| {name} | {step_s * 1e3:.1f} | {k / step_s:.2f} | {k * one / step_s:.2f}x | "
          f"{stores[name]['compile_s']:.1f} | {memory[name]:.2f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
