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
from transformer_jax.errors import CheckpointError
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
# The training loop's time budget is the planned training time with this margin: a machine
# that slows down mid-run still ends near the stated time, cooled down (decisions.cooldown_scale).
BUDGET_MARGIN = 1.05


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
  subword_sampling: bool        # whether the recipe samples segmentations (long runs only)
  machine: str                  # where it was measured

  @property
  def recipe(self) -> str:
    return ("long (subword sampling on)" if self.subword_sampling
            else "short (subword sampling off)")

  def summary(self) -> str:
    """The plan in one line."""
    train_minutes = self.num_train_steps * self.seconds_per_step / 60
    return (f"this machine trains ~{self.positions_per_step / self.seconds_per_step:,.0f} "
            f"token positions/s ({self.seconds_per_step:.3f} s a step): "
            f"{self.num_train_steps:,} steps of the {self.recipe} recipe in "
            f"{train_minutes:.1f} minutes, validation every {self.eval_every_steps:,} steps, "
            f"{self.decode_seconds / 60:.1f} minutes kept for the validations and the test; "
            f"the run planned for {self.minutes:g} minutes ({self.minutes_key}) on {self.machine}")


def planned(cfg: TrainConfig, config_dict: dict | None, workdir: Path, parts: dict,
             tokenizer):
  """`cfg` and `config_dict` with the steps, intervals and recipe of the workdir's plan, made
  now (this machine's step timed: returned third) unless a run of the workdir made one."""
  plan, made = recorded(workdir), None
  if plan is not None:
    log.info("The plan recorded in %s (made on %s) holds: %s steps of the %s recipe",
             workdir / layout.PLAN, plan.machine, f"{plan.num_train_steps:,}", plan.recipe)
  else:
    lr_scale = (np.float32(1.0),) if cfg.optimizer.cooldown_fraction > 0 else ()
    seconds = measure_step_seconds(
        parts["step_fn"], parts["state"], probe_batch(cfg.data, parts["mesh"]),
        parts["dropout_rng"], lr_scale, cfg.plan.probe_steps)
    data = data_plan(cfg.data)
    sentences = [sum(map(len, sets.values())) for sets in (
        validation_sets(data, tokenizer, cfg.eval_max_sentences), scoring_sets(data, tokenizer))]
    # (every host plans the same run: process 0's clock and step time)
    seconds, before = _from_process_0(seconds, seconds_since_start())
    plan = make_plan(
        minutes_for(cfg.plan, cfg.model.dtype), before, seconds,
        cfg.data.batch_size * (cfg.data.max_source_length + cfg.data.max_target_length),
        *sentences, cfg.eval_every_steps,
        cfg.plan.validation_share, cfg.plan.sampling_from_steps, hardware.describe_machine())
    record(plan, workdir)
    log.info("Plan: %s", plan.summary())
    made = plan
  return (*apply(plan, cfg, config_dict), made)


def minutes_for(plan_cfg, dtype: str) -> tuple[float, str]:
  """The minutes a run of matmul `dtype` (resolved) is planned for, and the key that says so:
  config.plan.f32_minutes for f32 where it is set, else config.plan.minutes."""
  if dtype == "float32" and plan_cfg.f32_minutes:
    return plan_cfg.f32_minutes, "config.plan.f32_minutes: matmuls in float32"
  return plan_cfg.minutes, "config.plan.minutes"


def make_plan(minutes: tuple[float, str], seconds_before: float, seconds_per_step: float,
              positions_per_step: int, validation_sentences: int, test_sentences: int,
              eval_every_steps: int, validation_share: float, sampling_from_steps: int,
              machine: str) -> Plan:
  """The steps that fit `minutes` (the number, and the key that set it) of wall clock from
  the command's start, `seconds_before` of them spent. Kept for decoding, each sentence at
  STEPS_PER_DECODED_SENTENCE steps' time: the test, the last validation, and the validations
  before it that `validation_share` of the training time allows (no more often than every
  `eval_every_steps`). At least one step, whatever the clock says."""
  (minutes, minutes_key) = minutes
  sentence_seconds = STEPS_PER_DECODED_SENTENCE * seconds_per_step
  validation_seconds = validation_sentences * sentence_seconds
  test_seconds = test_sentences * sentence_seconds
  loop_seconds = max(minutes * 60 - seconds_before - test_seconds, 0.0)  # steps, validations
  train_seconds = max(loop_seconds - validation_seconds, 0.0)

  def steps_with(validations: int) -> int:
    return max(int((train_seconds - validations * validation_seconds) / seconds_per_step), 1)

  earlier = (int(validation_share * train_seconds / validation_seconds)
             if validation_seconds > 0 else 0)
  steps = steps_with(earlier)
  while earlier and steps // (earlier + 1) < eval_every_steps:  # (not more often than that)
    earlier -= 1
    steps = steps_with(earlier)
  every = max(-(-steps // (earlier + 1)), 1)  # (the last validation: at the last step)
  return Plan(minutes, minutes_key, seconds_before, seconds_per_step, positions_per_step,
              test_seconds + (earlier + 1) * validation_seconds, steps, every,
              round(loop_seconds * BUDGET_MARGIN / 60, 2), steps >= sampling_from_steps,
              machine)


def apply(plan: Plan, cfg, config_dict: dict | None):
  """`cfg` and `config_dict` (as config.json records it) with `plan`'s steps, validation
  interval, time budget and recipe."""
  alpha = cfg.data.subword_sampling.alpha if plan.subword_sampling else 0.0
  sampling = dataclasses.replace(cfg.data.subword_sampling, alpha=alpha)
  budget = (min(cfg.time_budget_minutes, plan.time_budget_minutes) if cfg.time_budget_minutes
            else plan.time_budget_minutes)
  run_keys = dict(num_train_steps=plan.num_train_steps, eval_every_steps=plan.eval_every_steps,
                  time_budget_minutes=budget)
  cfg = dataclasses.replace(cfg, **run_keys, data=dataclasses.replace(
      cfg.data, subword_sampling=sampling))
  if config_dict is not None:
    data = config_dict["data"]
    config_dict = {**config_dict, **run_keys, "data": {
        **data, "subword_sampling": {**data["subword_sampling"], "alpha": alpha}}}
  return cfg, config_dict


def recorded(workdir: Path) -> Plan | None:
  """The plan of `workdir` (None: none was made there); a damaged plan.json is an error naming
  it, and is left as it is."""
  path = workdir / layout.PLAN
  if not path.is_file():
    return None
  try:
    return Plan(**json.loads(path.read_text(encoding="utf-8")))
  except (ValueError, TypeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is damaged ({e}); it is left as it is: remove it to plan "
                          "the run anew, or set config.num_train_steps") from None


def record(plan: Plan, workdir: Path):
  if jax.process_index() == 0:
    atomic.write_json(workdir / layout.PLAN, dataclasses.asdict(plan), indent=2)


def seconds_since_start() -> float:
  """Wall-clock seconds since this process started (Linux: its start time in /proc; elsewhere
  since this module was imported)."""
  try:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return time.time() - _IMPORTED


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
