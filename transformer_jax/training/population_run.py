"""A population's run (`config.population`): the loop of a single run (`run.Run`) over the
stacked state of `training.population`, with each member's own metrics, validation, best
checkpoint, early stopping and test, each written as an ordinary workdir of its own,
`<workdir>/members/<i>/`, that every tool takes (evaluate, translate, average, export,
init_from). The population's own workdir holds the stacked checkpoints (what a resume
restores) and the population's metrics: means and spreads over its members."""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from transformer_jax.config.population import MEMBER_KEYS
from transformer_jax.config.sections import TrainConfig
from transformer_jax.errors import ConfigError
from transformer_jax.evaluation.evaluator import ValidationCancelled
from transformer_jax.reporting import plots
from transformer_jax.reporting.metrics import METRICS_FILE, MetricWriter, truncate_metrics
from transformer_jax.training import decisions, population, validation
from transformer_jax.training.decisions import Outcome
from transformer_jax.training.optimizer import learning_rate_schedule
from transformer_jax.training.run import Run
from transformer_jax.training.state import count_params
from transformer_jax.training.train_metrics import train_metrics
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Member:
  """One member's config, workdir, writer, checkpointers and what it has reached."""
  index: int
  cfg: TrainConfig
  workdir: Path
  writer: MetricWriter
  ckpt: Checkpointer
  best_ckpt: Checkpointer
  stopper: decisions.EarlyStopping
  best_bleu: float
  skipped: int
  final: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PopulationRun(Run):
  """`Run` for a population: `state` is a `population.PopulationState`, the dropout key (K, 2)."""
  pop: population.Population
  members: list  # Member
  member_lr: list  # each member's learning-rate schedule

  @staticmethod
  def initial_state(cfg: TrainConfig, model, mesh):
    if cfg.init_from.workdir:
      raise ConfigError("config.population with config.init_from: fine-tune each member's "
                        "start as a run of its own (not supported in one population yet)")
    pop = population.Population.of(cfg)
    init, sharding = population.population_init(pop, mesh)
    init_keys, dropout_keys = population.member_rngs(pop)
    state = init(init_keys)
    log.info("Population of %d members (%s), each %s parameters; mesh %s", pop.size,
             ", ".join(population.varying_keys(cfg)) or "one config",
             f"{count_params(population.member_state(state, 0).params):,}",
             dict(mesh.shape))
    return state, sharding, dropout_keys

  @staticmethod
  def compile_step(cfg: TrainConfig, model, mesh, state_sharding, faults):
    return population.compile_population_step(population.Population.of(cfg), mesh,
                                              state_sharding, faults.nonfinite_at)

  @classmethod
  def own_parts(cls, parts: dict, start_step: int, config_dict: dict | None) -> dict:
    """The population, each member's learning-rate schedule, and each member's workdir set
    up (config, tokenizer) or resumed at the population's step (its metrics after that step
    dropped)."""
    cfg, workdir = parts["cfg"], parts["workdir"]
    pop = population.Population.of(cfg)
    config_dict = config_dict or (layout.read_config(workdir)
                                  if (workdir / layout.CONFIG).is_file()
                                  else dataclasses.asdict(cfg))
    members = []
    for i, member_cfg in enumerate(pop.members):
      member_dir = layout.member_dir(workdir, i)
      member_dir.mkdir(parents=True, exist_ok=True)
      layout.save_config(member_config_dict(config_dict, member_cfg), member_dir)
      _give_tokenizer(cfg, workdir, parts["tokenizer"], member_cfg, member_dir)
      history = truncate_metrics(member_dir / METRICS_FILE, start_step)
      best_ckpt = Checkpointer(member_dir / layout.BEST_CHECKPOINTS, 1, best_metric="bleu")
      members.append(Member(
          i, member_cfg, member_dir, MetricWriter(member_dir, resumed_at=start_step),
          Checkpointer(member_dir / layout.CHECKPOINTS, member_cfg.max_checkpoints_to_keep),
          best_ckpt, decisions.EarlyStopping(member_cfg.early_stopping_patience,
                                             decisions.bleu_history(history)),
          best_ckpt.best_value(),
          int(decisions.last_logged(history, "train/skipped_steps", 0.0))))
    return dict(pop=pop, members=members,
                member_lr=[learning_rate_schedule(m.optimizer, m.num_train_steps)
                           for m in pop.members])

  def resume_members(self):
    """A resumed population: each member's checkpoint at its step written if missing, and
    the members whose stop was requested meanwhile stopped."""
    if self.start_step:
      self._save_members()
    active = self._active()
    if self._stop_requested(active, self.start_step):
      self.state = self.state.replace(active=jax.device_put(active, self.state.active.sharding))

  def _stop_requested(self, active: np.ndarray, step: int) -> bool:
    """Members still training whose stop was requested (`layout.request_stop`: a sweep's
    pruner) marked inactive in `active`; whether there were any."""
    stopped = False
    for m in self.members:
      reason = layout.stop_request(m.workdir) if active[m.index] else None
      if reason:
        log.info("member %d: stopped at step %d (%s)", m.index, step, reason)
        active[m.index], stopped = False, True
    return stopped

  def _active(self) -> np.ndarray:
    """Which members still train (a copy of the state's mask, to change)."""
    return np.array(jax.device_get(self.state.active))

  def begin(self) -> bool:
    stop = super().begin()
    if not self._active().any():  # (a rerun of a population whose members all stopped)
      log.info("Every member of the population has stopped: no more training")
      return True
    return stop

  def train(self, step: int):
    """As a run's; at a logging step (where the metrics are read anyway), a population whose
    members have all stopped saves and ends there."""
    actions = super().train(step)
    if actions.log and not self._active().any():
      log.info("Every member of the population has stopped by step %d: training ends", step)
      actions = dataclasses.replace(actions, save=True, last=True)
    return actions

  def log_train(self, step: int, actions):
    """Each member's train metrics into its workdir; the population's means into its own."""
    sums = jax.device_get(self.tally.metric_sums)
    elapsed = time.time() - self.tally.t_last
    lr = float(self.lr_fn(step - 1)) * self.tally.lr_scale
    active = self._active()
    losses = []
    for m in self.members:
      mine = {k: v[m.index] for k, v in sums.items()}
      if not mine["steps"]:
        continue  # (stopped before these steps)
      if self.cfg.nonfinite_updates == "skip":
        m.skipped += int(mine["nonfinite_steps"])
      logged = train_metrics(mine, elapsed, self.tally.real_tokens,
                             float(self.member_lr[m.index](step - 1)) * self.tally.lr_scale,
                             m.skipped, self.pipeline)
      m.writer.write(step, logged)
      losses.append(logged["train/loss"])
      if mine["nonfinite_steps"] and not active[m.index]:
        log.warning("member %d: non-finite loss or gradient at step %d: stopped there "
                    "(config.nonfinite_updates='stop'); the others go on", m.index,
                    int(mine["first_nonfinite_step"]))
    logged = train_metrics({k: np.sum(v) for k, v in sums.items()}, elapsed, self.tally.real_tokens,
                           lr, sum(m.skipped for m in self.members), self.pipeline)
    logged.update({"train/loss": float(np.mean(losses)) if losses else float("nan"),
                   "train/loss_min": float(np.min(losses)) if losses else float("nan"),
                   "population/active_members": float(active.sum()),
                   "perf/member_steps_per_sec": float(np.sum(sums["steps"])) / elapsed,
                   "time/train_minutes": self.budget.minutes(step),
                   "train/lr_scale": self.tally.lr_scale})
    del logged["train/grad_norm"], logged["perf/steps_per_sec"]
    if actions.out_of_time:
      logged["train/time_budget_stop"] = 1.0
    self.writer.write(step, logged)
    self.progress.update(step, logged)
    self.tally.logged()

  def validate(self, step: int) -> Outcome:
    """Each member still training validated, its best checkpoint and early stopping."""
    self.clock.done(0)
    self.tally.validating = step
    self.faults.before_validation(step)
    active = self._active()
    self._stop_requested(active, step)
    bleus, records = {}, {}
    try:
      for m in self.members:
        if not active[m.index]:
          continue
        params = population.member_state(self.state, m.index).eval_params
        # (each member's records are written once all are validated: a validation that
        # SIGTERM cuts short leaves none, and the resumed run's early stopping counts each
        # member's BLEU of this step once)
        records[m.index] = _Records()
        bleus[m.index] = bleu = validation.validate(
            self.evaluators, params, step, records[m.index],
            self.cfg.decode.num_samples_to_log if not bleus else 0, m.final, m.workdir)
        if bleu > m.best_bleu:
          m.best_ckpt.save(step, population.member_state(self.state, m.index),
                           metrics={"bleu": bleu})
          layout.keep_best_validation(m.workdir)
          m.best_bleu = bleu
        if m.stopper.update(bleu):
          log.info("member %d: early stopping at step %d (BLEU %.2f not improved on for %d "
                   "evaluations)", m.index, step, m.stopper.best, m.stopper.patience)
          active[m.index] = False
    except ValidationCancelled:
      return self.cancelled(step)
    finally:
      self.tally.t_last = time.time()
    for i, written in records.items():
      written.write_to(self.members[i].writer)
      plots.plot_metrics(self.members[i].workdir)
    if bleus:
      values = np.asarray(list(bleus.values()))
      self.writer.write(step, {"eval/bleu": float(values.mean()),
                               "eval/bleu_std": float(values.std(ddof=1)) if len(values) > 1
                               else 0.0, "eval/bleu_max": float(values.max())})
      plots.plot_metrics(self.workdir)
    self.state = self.state.replace(active=jax.device_put(active, self.state.active.sharding))
    return Outcome.GO_ON if active.any() else Outcome.STOP_EARLY

  def save(self, step: int):
    super().save(step)
    self._save_members()

  def _save_members(self):
    """Each member's checkpoint at its own step (the population's, or where it stopped),
    unless written already."""
    steps = np.asarray(jax.device_get(self.state.members.step))
    for m in self.members:
      if m.ckpt.latest_step() != int(steps[m.index]):
        m.ckpt.save(int(steps[m.index]), population.member_state(self.state, m.index))

  def test(self):
    """Each member's test, in its workdir; the population's: each metric's mean and spread."""
    steps = np.asarray(jax.device_get(self.state.members.step))
    for m in self.members:
      m.final.update(validation.test(
          m.cfg, self.data, m.workdir, self.model, population.member_state(self.state, m.index)
          .eval_params, self.tokenizer, self.mesh, m.writer, int(steps[m.index])))
    self.tally.final.update(spread({m.index: m.final for m in self.members}))
    tested = {k: v for k, v in self.tally.final.items() if k.startswith("test/")}
    if tested:
      self.writer.write(int(steps.max()), tested)

  def finish(self, step: int, out_of_time: bool) -> dict[str, float]:
    final = super().finish(step, out_of_time)
    for m in self.members:
      m.ckpt.close()
      m.best_ckpt.close()
      plots.plot_metrics(m.workdir)
      m.writer.close()
    return final


class _Records:
  """A MetricWriter's calls, kept to be written later."""

  def __init__(self):
    self.calls = []

  def write(self, step: int, metrics: dict):
    self.calls.append(("write", step, metrics))

  def write_text(self, step: int, tag: str, text: str):
    self.calls.append(("write_text", step, tag, text))

  def write_to(self, writer: MetricWriter):
    for name, *args in self.calls:
      getattr(writer, name)(*args)


def spread(finals: dict[int, dict]) -> dict[str, float]:
  """For each metric every member reports: its mean over the members, `_std` (sample
  standard deviation) and `_min`/`_max`; and each member's value as `members/<i>/<key>`."""
  out = {}
  keys = set.intersection(*(set(f) for f in finals.values())) if finals else set()
  for key in sorted(keys):
    values = np.asarray([finals[i][key] for i in sorted(finals)], np.float64)
    out[key] = float(values.mean())
    out[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    out[f"{key}_min"], out[f"{key}_max"] = float(values.min()), float(values.max())
  for i, final in finals.items():
    out.update({f"members/{i}/{k}": v for k, v in final.items()})
  return out


def member_config_dict(config_dict: dict, cfg: TrainConfig) -> dict:
  """The population's config as member `cfg`'s own: its values, the population's data
  order, no population (what `population.member_configs` made, as the config file says it)."""
  out = copy.deepcopy(dict(config_dict))
  for path in MEMBER_KEYS.values():
    *sections, key = path.split(".")
    node = out
    for section in sections:
      node = node[section]
    node[key] = population.config_value(cfg, path)
  out["data_seed"] = cfg.data_seed
  out["population"] = {**out["population"], "seeds": 0, **{key: [] for key in MEMBER_KEYS}}
  return out


def _give_tokenizer(cfg: TrainConfig, workdir: Path, tokenizer, member_cfg: TrainConfig,
                    member_dir: Path):
  """The member's workdir gets the population's tokenizer (a copy where the config keeps it
  in the workdir) and its record."""
  if not member_cfg.data.tokenizer_path and jax.process_index() == 0:
    target = member_dir / layout.TOKENIZER
    if not target.is_file():
      shutil.copyfile(layout.tokenizer_path(cfg, workdir), target)
  layout.record_tokenizer(member_dir, tokenizer)
