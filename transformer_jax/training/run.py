"""A training run's parts and what it does at each step: set-up (model, data, state restored
from the workdir, evaluators, writers), one step's update, its logging, validation and save,
and the tear-down (the test, plots, the checkpoints' last writes). When each happens is
`decisions`' decision; `loop` drives the two."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.pipeline import train_pipeline
from transformer_jax.data.plan import DataPlan, data_plan
from transformer_jax.evaluation.evaluator import ValidationCancelled
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.reporting import plots
from transformer_jax.reporting.metrics import (
  METRICS_FILE,
  MetricWriter,
  sum_metrics,
  truncate_metrics,
)
from transformer_jax.reporting.progress import Progress
from transformer_jax.training import decisions, init_from, planning, settled_config, validation
from transformer_jax.training.decisions import Actions, Decisions, Outcome
from transformer_jax.training.optimizer import learning_rate_schedule
from transformer_jax.training.preemption import Faults, Preemption
from transformer_jax.training.prefetch import DevicePrefetch
from transformer_jax.training.state import count_params, initialise, state_init
from transformer_jax.training.step import compile_step
from transformer_jax.training.stopping import NonFiniteGuard, TimeBudget, WallClockIntervals
from transformer_jax.training.train_metrics import train_metrics
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer, abstract_like
from transformer_jax.workdir.preparation import load_tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Tally:
  """What a run counts as it trains, apart from its state: since the last log (the metric
  sums, real tokens, when the timing started), the learning-rate factor, skipped steps, a
  preemption, the step being validated, the best validation BLEU and the final metrics."""
  metric_sums: dict = dataclasses.field(default_factory=dict)
  real_tokens: int = 0
  t_last: float = dataclasses.field(default_factory=time.time)
  lr_scale: float = 1.0
  skipped: int = 0
  preempted: bool = False
  validating: int = -1
  best_bleu: float = float("-inf")  # that of checkpoints_best (what a validation must beat)
  final: dict = dataclasses.field(default_factory=dict)

  def logged(self):
    """After a log: the next one counts from here."""
    self.metric_sums, self.real_tokens, self.t_last = {}, 0, time.time()


@dataclasses.dataclass
class Run:
  """A run's parts, each set up once (`open_run`), its train state and its `tally`."""
  cfg: TrainConfig
  workdir: Path
  decisions: Decisions
  model: Any
  mesh: Any
  data: DataPlan  # config.data resolved: the corpora, evaluation and test sets
  tokenizer: Any
  pipeline: Any
  train_iter: DevicePrefetch
  state: Any
  state_sharding: Any
  dropout_rng: Any
  ckpt: Checkpointer
  best_ckpt: Checkpointer  # the best checkpoint by validation BLEU, apart from the newest
  start_step: int
  faults: Faults
  preemption: Preemption
  step_fn: Any
  lr_fn: Any
  evaluators: dict
  history: list
  writer: MetricWriter
  clock: WallClockIntervals
  budget: TimeBudget
  resumed_factor: tuple  # (the step resumed at, the lr factor logged before it)
  progress: Progress
  stopper: decisions.EarlyStopping
  nonfinite: NonFiniteGuard
  tally: Tally
  plan_made: planning.Plan | None  # the plan made at this start (None: steps set, or resumed)

  def begin(self) -> bool:
    """Before the first step: a validation that SIGTERM cut short is done first; a spent time
    budget trains no step. Returns whether training stops here."""
    start = self.decisions.start(self.history, self.start_step,
                                 self.budget.spent(self.start_step))
    stop = False
    if start.validate_first:
      log.info("Validating step %d first: SIGTERM cut its validation short", self.start_step)
      stop = self.validate(self.start_step) is not Outcome.GO_ON
    if start.budget_spent:
      log.warning("The time budget (config.time_budget_minutes=%g) was spent at step %d: no "
                  "more training; raise it (a planned run: and set config.num_train_steps) "
                  "to train on", self.cfg.time_budget_minutes,
                  self.start_step)
      stop = True
    return stop or self.start_step >= self.cfg.num_train_steps

  def train(self, step: int) -> Actions:
    """The update of `step`; returns what follows it."""
    batch, real, stats = next(self.train_iter)
    self.tally.real_tokens += real
    self.pipeline.count(stats)
    self.tally.lr_scale = self.decisions.learning_rate_scale(step, self.budget.minutes(step),
                                                             self.resumed_factor)
    # (the step takes the cooldown factor only when there is a cooldown: step.compile_step)
    lr_scale = (np.float32(self.tally.lr_scale),) if self.decisions.cooldown_fraction > 0 else ()
    self.state, step_metrics = self.step_fn(self.state, batch, self.dropout_rng, *lr_scale)
    self.tally.metric_sums = sum_metrics(self.tally.metric_sums, step_metrics)
    self.faults.after_step(step)
    self.tally.preempted = self.preemption.requested(step)
    if step % self.decisions.log_every_steps == 0:  # (every process, at the same steps)
      self.budget.agree(step)
    due = (self.clock.due() if self.decisions.asks_wall_clock(step, self.clock.active)
           else (False, False))
    return self.decisions.actions(step, self.tally.preempted, self.budget.spent(step), *due)

  def log_train(self, step: int, actions: Actions):
    """The train metrics of the steps since the last log (a non-finite step under 'stop'
    raises here, before anything is saved)."""
    sums = jax.device_get(self.tally.metric_sums)
    self.nonfinite.check(sums, step, self.ckpt)
    self.tally.skipped += self.nonfinite.report(sums)
    logged = train_metrics(sums, time.time() - self.tally.t_last, self.tally.real_tokens,
                           float(self.lr_fn(step - 1)) * self.tally.lr_scale, self.tally.skipped,
                           self.pipeline)
    logged["time/train_minutes"] = self.budget.minutes(step)
    logged["train/lr_scale"] = self.tally.lr_scale
    if actions.out_of_time:
      logged["train/time_budget_stop"] = 1.0
    self.writer.write(step, logged)
    self.progress.update(step, logged)
    self.tally.logged()

  def validate(self, step: int) -> Outcome:
    """Validation of `step`, its best checkpoint and early stopping."""
    self.clock.done(0)
    self.tally.validating = step
    self.faults.before_validation(step)
    try:
      bleu = validation.validate(self.evaluators, self.state.eval_params, step, self.writer,
                                 self.cfg.decode.num_samples_to_log, self.tally.final, self.workdir)
    except ValidationCancelled:
      return self.cancelled(step)
    finally:
      self.tally.t_last = time.time()  # evaluation time does not count against training speed
    plots.plot_metrics(self.workdir)
    if bleu > self.tally.best_bleu:  # (only a better model is written: it replaces the best)
      self.best_ckpt.save(step, self.state, metrics={"bleu": bleu})
      layout.keep_best_validation(self.workdir)
      self.tally.best_bleu = bleu
    if self.stopper.update(bleu):
      log.info("Early stopping at step %d: validation BLEU has not improved on %.2f for %d "
               "evaluations", step, self.stopper.best, self.stopper.patience)
      return Outcome.STOP_EARLY
    return Outcome.GO_ON

  def cancelled(self, step: int) -> Outcome:
    """The validation of `step`, cut short by SIGTERM: recorded, to be done first on resume."""
    log.warning("SIGTERM during the validation of step %d: validation stopped (the resumed "
                "run does it first)", step)
    self.writer.write(step, {decisions.VALIDATION_CANCELLED: 1.0})
    self.tally.preempted = True
    return Outcome.CANCELLED

  def save(self, step: int):
    self.faults.before_save(step, self.ckpt.directory)
    self.ckpt.save(step, self.state, self.train_iter)
    self.clock.done(1)
    self.faults.after_save(step)
    self.tally.t_last = time.time()

  def test(self):
    self.tally.final.update(validation.test(
        self.cfg, self.data, self.workdir, self.model, self.state.eval_params, self.tokenizer,
        self.mesh, self.writer, int(jax.device_get(self.state.step))))

  # What a population (training.population_run) does its own way: its state, its step, its
  # members' workdirs.
  @staticmethod
  def initial_state(cfg: TrainConfig, model, mesh):
    """(the state before training, its shardings, the dropout key)."""
    init, state_sharding = state_init(cfg, model, mesh)  # fails fast on an uneven split
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(cfg.seed))
    state = initialise(init, state_sharding, init_rng)
    log.info("Model: %s parameters; mesh %s", f"{count_params(state.params):,}",
             dict(mesh.shape))
    return state, state_sharding, dropout_rng

  @staticmethod
  def compile_step(cfg: TrainConfig, model, mesh, state_sharding, faults: Faults):
    return compile_step(cfg, model, mesh, state_sharding, faults.nonfinite_at)

  @classmethod
  def own_parts(cls, parts: dict, start_step: int, config_dict: dict | None) -> dict:
    """The parts a kind of run adds to a run's (`parts`: those set up so far)."""
    return {}

  def resume_members(self):
    """After the run is set up."""

  def finish(self, step: int, out_of_time: bool) -> dict[str, float]:
    """After the last step: the stop reported, and the test unless preempted."""
    self.progress.close()
    self.preemption.close()
    self.train_iter.close()
    if out_of_time and not self.tally.preempted:
      log.warning("Time budget of %g minutes spent: training ended at step %d of %d, "
                  "learning-rate factor %.6f (saved, validated; rerun with a larger "
                  "config.time_budget_minutes, a planned run with config.num_train_steps set, "
                  "to go on)", self.cfg.time_budget_minutes, step,
                  self.cfg.num_train_steps, self.tally.lr_scale)
      self.tally.final["time_budget_stop_at_step"] = step
    log.info("Data: %s", self.pipeline.filter.summary())
    if self.tally.preempted:
      log.warning("Preempted: checkpoint saved at step %d in %s; rerun the same command to "
                  "resume", step, self.ckpt.directory)
      self.tally.final["preempted_at_step"] = step
    else:  # (the test sets: config.data.test_split and each corpus's; none when none is named)
      self.test()
    if self.plan_made is not None:
      minutes = planning.seconds_since_start() / 60
      self.tally.final["run_minutes"] = minutes
      self.writer.write(step, {"time/run_minutes": minutes})
      log.info("The run took %.1f minutes from the command's start; planned: %g (%s)",
               minutes, self.plan_made.minutes, self.plan_made.minutes_key)
    plots.plot_metrics(self.workdir)
    self.writer.close()
    return self.tally.final


@contextlib.contextmanager
def open_run(cfg: TrainConfig, workdir: Path, config_dict: dict | None, run_type=Run):
  """The run of `cfg` in `workdir` (a `run_type`), set up and resumed from its latest
  checkpoint; on leaving, a save in flight completes (also on an error) before the process
  ends."""
  cfg, config_dict = settled_config.resolve_dtype(cfg, config_dict, workdir)
  cfg, config_dict = settled_config.keep_as_trained(cfg, config_dict, workdir)
  parts = _model(cfg, run_type)
  tokenizer = _tokenizer(cfg, workdir)
  # (before the batches, whose recipe the plan picks)
  cfg, config_dict, parts["plan_made"] = planning.planned(cfg, config_dict, workdir, parts,
                                                          tokenizer)
  parts.update(_data(cfg, workdir, parts["mesh"], tokenizer))
  try:
    run = _resumed(parts, config_dict, run_type)
    run.resume_members()
    yield run
  finally:
    parts["ckpt"].close()
    parts["best_ckpt"].close()


def _model(cfg: TrainConfig, run_type) -> dict:
  """The model, its mesh, initial state and step: a run's first parts."""
  mesh = settled_config.make_mesh(cfg)
  model = Transformer(cfg.model)
  state, state_sharding, dropout_rng = run_type.initial_state(cfg, model, mesh)
  faults = Faults.from_env()
  step_fn = run_type.compile_step(cfg, model, mesh, state_sharding, faults)
  return dict(model=model, mesh=mesh, state=state, state_sharding=state_sharding,
              dropout_rng=dropout_rng, faults=faults, step_fn=step_fn)


def _tokenizer(cfg: TrainConfig, workdir: Path):
  """The run's tokenizer, trained on first use. (Fine-tuning's first start: the tokenizer of
  the run it starts from; once the run has a checkpoint it resumes from its own, with its own
  copy, and the source may be gone.)"""
  data = data_plan(cfg.data)
  if cfg.init_from.workdir and not layout.has_checkpoints(workdir):
    return init_from.load_tokenizer(cfg, workdir, data)
  return load_tokenizer(cfg, workdir, data)


def _data(cfg: TrainConfig, workdir: Path, mesh, tokenizer) -> dict:
  """The training batches on their way to the devices, the checkpointers and the loop's
  decisions: the parts that follow the model and the tokenizer."""
  data = data_plan(cfg.data)
  pipeline = train_pipeline(data, tokenizer, cfg.batch_seed, jax.process_index(),
                            jax.process_count())

  def to_devices(host_batch):  # (in the prefetch thread: the next batch while a step runs)
    host_batch, stats = pipeline.split_stats(host_batch)
    real = int((host_batch["inputs"] > 0).sum() + (host_batch["targets"] > 0).sum())
    return mesh_lib.global_batch(host_batch, mesh), real, stats

  train_iter = DevicePrefetch(iter(pipeline.dataset), to_devices)
  if cfg.optimizer.ema_decay:
    log.info("Moving average of the parameters (decay %g): validation, the best checkpoint "
             "and the test use it", cfg.optimizer.ema_decay)
  return dict(cfg=cfg, workdir=workdir, decisions=Decisions.of(cfg), data=data,
              tokenizer=tokenizer, pipeline=pipeline, train_iter=train_iter,
              ckpt=Checkpointer(workdir / layout.CHECKPOINTS, cfg.max_checkpoints_to_keep),
              best_ckpt=Checkpointer(workdir / layout.BEST_CHECKPOINTS, 1, best_metric="bleu"))


def _resumed(parts: dict, config_dict: dict | None, run_type) -> Run:
  """The run of `parts`, restored from its latest checkpoint, with its step function,
  evaluators, writers, clocks and the history its decisions go on from."""
  cfg, workdir = parts["cfg"], parts["workdir"]
  start_step, restored = parts["ckpt"].restore_latest(abstract_like(parts["state"]),
                                                      parts["train_iter"])
  if restored is not None:
    parts["state"] = restored
    log.info("Resuming from step %d", start_step)
  elif cfg.init_from.workdir:
    parts["state"] = init_from.initial_state(cfg, workdir, parts["model"], parts["mesh"],
                                             parts["state"])
  if config_dict is not None:  # (only now: a config its checkpoints reject is not recorded)
    layout.save_config(config_dict, workdir)
  if parts["plan_made"] is not None:  # (with it: what config.json records is the plan's)
    planning.record(parts["plan_made"], workdir)
  faults, preemption, tally = parts["faults"], Preemption(parts["ckpt"].manager), Tally()

  def cancel_validation() -> bool:  # (between its batches: whether SIGTERM has arrived)
    faults.before_validation_batch(tally.validating)
    return preemption.signalled_here()

  evaluators = validation.evaluators(cfg, parts["data"], parts["model"], parts["tokenizer"],
                                     parts["mesh"], cancel_validation)
  # (before the writer appends: the records of steps this run redoes go)
  history = truncate_metrics(workdir / METRICS_FILE, start_step)
  writer = MetricWriter(workdir, resumed_at=start_step)
  _carry_counts(parts["pipeline"], history)
  # (last of the set-up, which its clock does not count; its first check is before step 1)
  budget = TimeBudget(cfg.time_budget_minutes,
                      decisions.last_logged(history, "time/train_minutes", 0.0), start_step,
                      clock=faults.clock)
  # (the saved best's own BLEU, not the log's: a kill may have logged a validation whose
  # best checkpoint it never wrote)
  tally.best_bleu, tally.t_last = parts["best_ckpt"].best_value(), time.time()
  return run_type(
      **parts, start_step=start_step, preemption=preemption,
      lr_fn=learning_rate_schedule(cfg.optimizer, cfg.num_train_steps), evaluators=evaluators,
      history=history, writer=writer,
      clock=WallClockIntervals(cfg.eval_every_minutes, cfg.checkpoint_every_minutes),
      budget=budget,
      resumed_factor=(start_step, decisions.last_logged(history, "train/lr_scale", 1.0)),
      progress=Progress(cfg.num_train_steps, start_step, budget.seconds_left(start_step)),
      stopper=decisions.EarlyStopping(cfg.early_stopping_patience,
                                      decisions.bleu_history(history)),
      nonfinite=NonFiniteGuard(cfg.nonfinite_updates), tally=tally,
      **run_type.own_parts(parts, start_step, config_dict))


def _carry_counts(pipeline, history: list[dict]):
  """The data counts of a resumed run: those logged at its checkpoint's step (pre-tokenized
  path; the text path counts what grain reads, from 0 in each run)."""
  if pipeline.epochs is None:
    return
  fields, corpus = decisions.carried_counts(history, pipeline.corpus_names)
  for field, value in fields.items():
    setattr(pipeline.filter, field, value)
  for kind, values in corpus.items():
    setattr(pipeline.filter, f"corpus_{kind}", np.asarray(values, np.int64))
