"""A run planned to end within a stated time (config.plan, with config.num_train_steps 0): the
number of steps from the speed of this machine's step, measured before step 1, with the time
the validations and the test decode take reserved, so that the schedule (warmup, peak,
cooldown) is set for the steps the run will train, not cut short by a clock.

The plan is made once, before the first step, and written to the workdir (plan.json): a
resumed run keeps it, on this machine or another. The arithmetic is pure (`make_plan`); the
measurement (`measure_step_seconds`) times the run's own compiled step on a batch of the
training batches' shape, so its compilation is the run's."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax import atomic
from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.eval_sets import scoring_sets, validation_sets
from transformer_jax.data.plan import data_plan
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.parallel import hardware
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)

# Decoding a validation sentence (beam 4, first compilations included) costs about this many of
# the default recipe's training steps on the CPUs measured, with some margin (BENCHMARKS.md, "A
# demo that fits the machine"): what the plan keeps for the validations and the test before it
# has decoded anything. A model that decodes slower for its step (a much smaller one) overruns
# by the difference, which the run's last line reports.
STEPS_PER_DECODED_SENTENCE = 0.02
# The training loop's time budget is the planned loop (steps and validations) with this margin:
# a machine that slows down mid-run still ends near the stated time, cooled down
# (decisions.cooldown_scale), while one that runs as planned ends on its last step.
BUDGET_MARGIN = 1.05
# The share of the stated minutes the plan leaves for what it does not time: the set-up after
# it (the batches' pipeline, the validation sets, a restore), checkpoint saves, the plots, and
# the data pipeline's share of the cores during steps.
UNMEASURED_SHARE = 0.03


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a run fits `minutes`: what was measured, and the steps and intervals chosen."""
  minutes: float                # the whole run's, from the command's start
  minutes_key: str              # the key that set them (config.plan.minutes or f32_minutes)
  seconds_before: float         # from the command's start to the plan (set-up, compilation)
  seconds_per_step: float       # the measured step
  positions_per_step: int       # token positions of a training batch (source + target)
  decode_seconds: float         # reserved: the validations and the test
  num_train_steps: int
  eval_every_steps: int         # the validations before the last: what validation_share allows
  time_budget_minutes: float    # the training loop's (steps, validations, saves), with a margin
  long_recipe: bool             # at least config.plan.sampling_from_steps steps
  sampling_alpha: float         # the recipe's subword sampling (config.data.subword_sampling)
  machine: str                  # where it was measured

  @property
  def recipe(self) -> str:
    sampling = f"subword sampling alpha {self.sampling_alpha:g}" if self.sampling_alpha else (
        "no subword sampling")
    return f"{'long' if self.long_recipe else 'short'} recipe ({sampling})"

  def summary(self) -> str:
    """The plan in one line."""
    train_minutes = self.num_train_steps * self.seconds_per_step / 60
    return (f"this machine trains ~{self.positions_per_step / self.seconds_per_step:,.0f} "
            f"token positions/s ({self.seconds_per_step:.3f} s a step): "
            f"{self.num_train_steps:,} steps of the {self.recipe} in "
            f"{train_minutes:.1f} minutes, validation every {self.eval_every_steps:,} steps, "
            f"{self.decode_seconds / 60:.1f} minutes kept for the validations and the test; "
            f"the run planned for {self.minutes:g} minutes ({self.minutes_key}) on {self.machine}")


def planned(cfg: TrainConfig, config_dict: dict | None, workdir: Path, parts: dict,
            tokenizer):
  """`cfg` and `config_dict` with the steps, intervals and recipe of the workdir's plan, and
  the plan made now (None: the workdir's own). A new run (no checkpoint) is planned here:
  this machine's step timed. A run resumed keeps its plan.json; one trained before it had a
  plan keeps the steps config.json records. With config.num_train_steps set, no plan: a
  resumed planned run keeps only its recipe (its batches' segmentation)."""
  plan = recorded(workdir)
  if cfg.num_train_steps:
    if plan is not None and plan.sampling_alpha != cfg.data.subword_sampling.alpha:
      log.warning("config.num_train_steps=%d set: the plan in %s is not followed, but its "
                  "recipe is (subword sampling alpha %g, as trained)", cfg.num_train_steps,
                  workdir / layout.PLAN, plan.sampling_alpha)
      return (*_with_alpha(cfg, config_dict, plan.sampling_alpha), None)
    return cfg, config_dict, None
  if plan is not None:
    minutes = minutes_for(cfg.plan, cfg.model.dtype)[0]
    log.info("The plan recorded in %s (made on %s) holds: %s steps of the %s", workdir /
             layout.PLAN, plan.machine, f"{plan.num_train_steps:,}", plan.recipe)
    if minutes != plan.minutes:
      log.warning("The plan in %s was made for %g minutes, not the %g configured now: it "
                  "holds (plan anew in another workdir)", workdir / layout.PLAN,
                  plan.minutes, minutes)
    return (*apply(plan, cfg, config_dict), None)
  if layout.has_checkpoints(workdir):
    return (*_as_trained(cfg, config_dict, workdir), None)
  plan = _new_plan(cfg, parts, tokenizer)
  log.info("Plan: %s", plan.summary())
  if 0 < cfg.time_budget_minutes < plan.time_budget_minutes:
    log.warning("config.time_budget_minutes=%g is shorter than the plan's %g: training will "
                "end on that clock, before its planned last step", cfg.time_budget_minutes,
                plan.time_budget_minutes)
  return (*apply(plan, cfg, config_dict), plan)


def _new_plan(cfg: TrainConfig, parts: dict, tokenizer) -> Plan:
  lr_scale = (np.float32(1.0),) if cfg.optimizer.cooldown_fraction > 0 else ()
  seconds = measure_step_seconds(
      parts["step_fn"], parts["state"], probe_batch(cfg.data, parts["mesh"]),
      parts["dropout_rng"], lr_scale, cfg.plan.probe_steps)
  data = data_plan(cfg.data)
  sentences = [sum(map(len, sets.values())) for sets in (
      validation_sets(data, tokenizer, cfg.eval_max_sentences), scoring_sets(data, tokenizer))]
  # (every host plans the same run: process 0's clock and step time)
  seconds, before = _from_process_0(seconds, seconds_since_start())
  return make_plan(
      minutes_for(cfg.plan, cfg.model.dtype), before, seconds,
      cfg.data.batch_size * (cfg.data.max_source_length + cfg.data.max_target_length),
      *sentences, cfg.eval_every_steps, cfg.plan.validation_share, cfg.plan.max_steps,
      (cfg.plan.sampling_from_steps, long_recipe_alpha(cfg), cfg.data.subword_sampling.alpha),
      hardware.describe_machine())


def long_recipe_alpha(cfg: TrainConfig) -> float:
  """The subword sampling alpha of the long recipe: config.plan.sampling_alpha (0: the
  configured one), or the configured one where the data cannot sample (a mixture, the text
  path: config.data's own check says why)."""
  alpha = cfg.plan.sampling_alpha or cfg.data.subword_sampling.alpha
  try:
    _with_alpha(cfg, None, alpha)
  except ConfigError as e:
    log.info("The long recipe trains as configured, without its subword sampling: %s", e)
    return cfg.data.subword_sampling.alpha
  return alpha


def _as_trained(cfg: TrainConfig, config_dict: dict | None, workdir: Path):
  """A run trained before it had a plan, resumed with num_train_steps 0: its recorded steps,
  interval, budget and recipe, with a warning."""
  trained = layout.read_config(workdir)
  keys = {key: trained[key] for key in ("num_train_steps", "eval_every_steps",
                                        "time_budget_minutes")}
  log.warning("config.num_train_steps=0 (planned), but %s was trained without a plan: it "
              "resumes with the values its config.json records (%s)", workdir,
              ", ".join(f"{k}={v}" for k, v in keys.items()))
  cfg = dataclasses.replace(cfg, **keys)
  config_dict = None if config_dict is None else {**config_dict, **keys}
  return _with_alpha(cfg, config_dict, trained["data"]["subword_sampling"]["alpha"])


def _with_alpha(cfg: TrainConfig, config_dict: dict | None, alpha: float):
  """`cfg` and `config_dict` with config.data.subword_sampling.alpha `alpha`."""
  sampling = dataclasses.replace(cfg.data.subword_sampling, alpha=alpha)
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, subword_sampling=sampling))
  if config_dict is not None:
    data = config_dict["data"]
    config_dict = {**config_dict, "data": {
        **data, "subword_sampling": {**data["subword_sampling"], "alpha": alpha}}}
  return cfg, config_dict


def minutes_for(plan_cfg, dtype: str) -> tuple[float, str]:
  """The minutes a run of matmul `dtype` (resolved) is planned for, and the key that says so:
  config.plan.f32_minutes for f32 where it is set, else config.plan.minutes."""
  if dtype == "float32" and plan_cfg.f32_minutes:
    return plan_cfg.f32_minutes, "config.plan.f32_minutes: matmuls in float32"
  return plan_cfg.minutes, "config.plan.minutes"


def make_plan(minutes: tuple[float, str], seconds_before: float, seconds_per_step: float,
              positions_per_step: int, validation_sentences: int, test_sentences: int,
              eval_every_steps: int, validation_share: float, max_steps: int,
              recipes: tuple[int, float, float], machine: str) -> Plan:
  """The steps that fit `minutes` (the number, and the key that set it) of wall clock from
  the command's start, `seconds_before` of them spent. Kept for decoding, each sentence at
  STEPS_PER_DECODED_SENTENCE steps' time: the test, the last validation, and the validations
  before it that `validation_share` of the training time allows (no more often than every
  `eval_every_steps`); UNMEASURED_SHARE of the minutes left for what the plan does not time;
  no more than `max_steps` (0: no limit).
  `recipes`: (the steps from which the long recipe holds, its subword sampling alpha, the short
  one's). At least one step, whatever the clock says."""
  (minutes, minutes_key), (long_from, long_alpha, short_alpha) = minutes, recipes
  sentence_seconds = STEPS_PER_DECODED_SENTENCE * seconds_per_step
  validation_seconds = validation_sentences * sentence_seconds
  test_seconds = test_sentences * sentence_seconds
  loop_seconds = max(minutes * 60 * (1 - UNMEASURED_SHARE) - seconds_before - test_seconds,
                     0.0)  # (steps and validations)
  train_seconds = max(loop_seconds - validation_seconds, 0.0)

  def steps_with(validations: int) -> int:
    steps = max(int((train_seconds - validations * validation_seconds) / seconds_per_step), 1)
    return min(steps, max_steps) if max_steps else steps

  earlier = (int(validation_share * train_seconds / validation_seconds)
             if validation_seconds > 0 else 0)
  steps = steps_with(earlier)
  while earlier and steps // (earlier + 1) < eval_every_steps:  # (not more often than that)
    earlier -= 1
    steps = steps_with(earlier)
  every = max(-(-steps // (earlier + 1)), 1)  # (the last validation: at the last step)
  return Plan(minutes, minutes_key, seconds_before, seconds_per_step, positions_per_step,
              test_seconds + (earlier + 1) * validation_seconds, steps, every,
              max(round(loop_seconds * BUDGET_MARGIN / 60, 2), 0.01), steps >= long_from,
              long_alpha if steps >= long_from else short_alpha, machine)


def apply(plan: Plan, cfg, config_dict: dict | None):
  """`cfg` and `config_dict` (as config.json records it) with `plan`'s steps, validation
  interval, time budget (the config's where shorter) and recipe."""
  budget = (min(cfg.time_budget_minutes, plan.time_budget_minutes) if cfg.time_budget_minutes
            else plan.time_budget_minutes)
  run_keys = dict(num_train_steps=plan.num_train_steps, eval_every_steps=plan.eval_every_steps,
                  time_budget_minutes=budget)
  cfg = dataclasses.replace(cfg, **run_keys)
  config_dict = None if config_dict is None else {**config_dict, **run_keys}
  return _with_alpha(cfg, config_dict, plan.sampling_alpha)


def recorded(workdir: Path) -> Plan | None:
  """The plan of `workdir` (None: none was made there); a damaged plan.json is an error naming
  it, and is left as it is."""
  path = workdir / layout.PLAN
  if not path.is_file():
    return None
  try:
    values = json.loads(path.read_text(encoding="utf-8"))
    return Plan(**{f.name: values[f.name] for f in dataclasses.fields(Plan)})
  except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is damaged ({type(e).__name__}: {e}); it is left as it "
                          "is: mend it, or set config.num_train_steps to go on without "
                          "it") from None


def record(plan: Plan, workdir: Path):
  if jax.process_index() == 0:
    atomic.write_json(workdir / layout.PLAN, dataclasses.asdict(plan), indent=2)


def seconds_since_start() -> float:
  """Wall-clock seconds since this process started: from its start time in /proc (Linux)
  where that agrees with the clock (a container may show the host's boot in one file and its
  own in the other), else since this module was imported (after the interpreter and JAX)."""
  since_import = time.time() - _IMPORTED
  try:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    seconds = uptime - ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return since_import
  return seconds if since_import <= seconds <= since_import + 300 else since_import


_IMPORTED = time.time()


def probe_batch(data_cfg, mesh) -> dict:
  """A global batch of the training batches' shape and layout (packed rows, each position
  real): what a step's time depends on."""
  rows = data_cfg.batch_size // jax.process_count()
  batch = {}
  for side, length in (("inputs", data_cfg.max_source_length),
                       ("targets", data_cfg.max_target_length)):
    batch[side] = np.full((rows, length), 5, np.int32)
    batch[f"{side}_positions"] = np.tile(np.arange(length, dtype=np.int32), (rows, 1))
    batch[f"{side}_segment_ids"] = np.ones((rows, length), np.int32)
  return mesh_lib.global_batch(batch, mesh)


def measure_step_seconds(step_fn, state, batch, rng, step_args: tuple, steps: int) -> float:
  """The median seconds of `steps` calls of `step_fn` on a copy of `state` (the step donates
  its state; the run's stays as it is), after one call that compiles it."""
  state = jax.tree_util.tree_map(jnp.copy, state)
  seconds = []
  for _ in range(steps + 1):
    start = time.perf_counter()
    state, metrics = step_fn(state, batch, rng, *step_args)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds[1:]) if steps else seconds[0]


def _from_process_0(*values: float) -> tuple[float, ...]:
  if jax.process_count() == 1:
    return values
  return tuple(float(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(values)))
