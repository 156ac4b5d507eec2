"""The training loop: resume from the workdir, train with periodic logging, validation and
checkpoints, stop on preemption or early stopping, and score the test split at the end."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path

import jax
import numpy as np

from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.pipeline import train_pipeline
from transformer_jax.errors import ConfigError
from transformer_jax.evaluation.evaluator import ValidationCancelled
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel import numerics
from transformer_jax.reporting import plots
from transformer_jax.reporting.metrics import (
  METRICS_FILE,
  MetricWriter,
  sum_metrics,
  truncate_metrics,
)
from transformer_jax.reporting.progress import Progress
from transformer_jax.training import validation
from transformer_jax.training.optimizer import cooldown_scale, learning_rate_schedule
from transformer_jax.training.preemption import Faults, Preemption
from transformer_jax.training.prefetch import DevicePrefetch
from transformer_jax.training.state import count_params, initialise, state_init
from transformer_jax.training.step import train_step
from transformer_jax.training.stopping import (
  EarlyStopping,
  NonFiniteGuard,
  TimeBudget,
  WallClockIntervals,
)
from transformer_jax.workdir import layout, lock
from transformer_jax.workdir.checkpoints import Checkpointer, abstract_like
from transformer_jax.workdir.preparation import load_tokenizer

log = logging.getLogger(__name__)


def make_mesh(cfg: TrainConfig):
  """The device mesh of `cfg`, checked against the batch it must split."""
  mesh = mesh_lib.make_mesh(cfg.parallelism)
  dp = mesh_lib.data_parallel_size(mesh)
  if cfg.data.batch_size % (dp * cfg.num_micro_batches):
    raise ConfigError(f"config.data.batch_size={cfg.data.batch_size} is not divisible by the "
                      f"data-parallel size {dp} (mesh {dict(mesh.shape)}) times "
                      f"config.num_micro_batches={cfg.num_micro_batches}")
  return mesh


def train_and_evaluate(cfg: TrainConfig, workdir: str | Path, config_dict: dict | None = None,
                       wait_for_workdir: float = 0.0) -> dict[str, float]:
  """Trains (resuming from the latest checkpoint in `workdir`), evaluates, and returns the
  final metrics (including `test/bleu` when a test split is configured). `config_dict` is
  saved as the workdir's config.json once its checkpoints have accepted the config. Another
  process writing `workdir` is an error, or is waited for up to `wait_for_workdir` seconds."""
  workdir = Path(workdir)
  layout.check_writable(workdir)  # (a read-only or full filesystem: one line, before any work)
  with lock.hold(workdir, "train", wait_for_workdir):  # (one writer per workdir)
    return _train_and_evaluate(cfg, workdir, config_dict)


def _train_and_evaluate(cfg: TrainConfig, workdir: Path, config_dict: dict | None
                        ) -> dict[str, float]:
  cfg, config_dict = resolve_dtype(cfg, config_dict, workdir)
  cfg, config_dict = keep_data_order(cfg, config_dict, workdir)
  mesh = make_mesh(cfg)
  model = Transformer(cfg.model)
  init, state_sharding = state_init(cfg, model, mesh)  # fails fast on an uneven split
  tok = load_tokenizer(cfg, workdir)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(cfg.seed))

  pipeline = train_pipeline(cfg.data, tok, cfg.seed, jax.process_index(), jax.process_count())

  def to_devices(host_batch):  # (in the prefetch thread: the next batch while a step runs)
    host_batch, stats = pipeline.split_stats(host_batch)
    real = int((host_batch["inputs"] > 0).sum() + (host_batch["targets"] > 0).sum())
    return mesh_lib.global_batch(host_batch, mesh), real, stats

  train_iter = DevicePrefetch(iter(pipeline.dataset), to_devices)
  state = initialise(init, state_sharding, init_rng)
  log.info("Model: %s parameters; mesh %s", f"{count_params(state.params):,}",
           dict(mesh.shape))
  if cfg.optimizer.ema_decay:
    log.info("Moving average of the parameters (decay %g): validation, the best checkpoint "
             "and the test use it", cfg.optimizer.ema_decay)
  ckpt = Checkpointer(workdir / layout.CHECKPOINTS, cfg.max_checkpoints_to_keep)
  # The best checkpoint by validation BLEU, kept apart from the newest ones.
  best_ckpt = Checkpointer(workdir / layout.BEST_CHECKPOINTS, 1, best_metric="bleu")
  try:
    start_step, restored = ckpt.restore_latest(abstract_like(state), train_iter)
    if restored is not None:
      state = restored
      log.info("Resuming from step %d", start_step)
    if config_dict is not None:  # (only now: a config its checkpoints reject is not recorded)
      layout.save_config(config_dict, workdir)
    faults = Faults.from_env()
    preemption = Preemption(ckpt.manager)

    # The cooldown factor is an argument only when there is a cooldown: without one the step
    # compiles with the constant 1, the same program (and bits) as a step without the factor.
    cooling = cfg.optimizer.cooldown_fraction > 0
    p_train_step = jax.jit(
        functools.partial(train_step, model=model, label_smoothing=cfg.label_smoothing,
                          num_micro_batches=cfg.num_micro_batches,
                          nonfinite_at_step=faults.nonfinite_at, mesh=mesh),
        in_shardings=(state_sharding, mesh_lib.batch_sharding(mesh), mesh_lib.replicated(mesh))
        + (mesh_lib.replicated(mesh),) * cooling,
        out_shardings=(state_sharding, mesh_lib.replicated(mesh)),
        donate_argnums=(0,))
    lr_fn = learning_rate_schedule(cfg.optimizer, cfg.num_train_steps)
    evaluators = validation.evaluators(cfg, model, tok, mesh, preemption.signalled_here)
    # (before the writer appends: the records of steps this run redoes go)
    history = truncate_metrics(workdir / METRICS_FILE, start_step)
    writer = MetricWriter(workdir, resumed_at=start_step)
    _restore_counts(pipeline, history)
    clock = WallClockIntervals(cfg.eval_every_minutes, cfg.checkpoint_every_minutes)
    budget = TimeBudget(cfg.time_budget_minutes, _last_logged(history, "time/train_minutes", 0.0))
    progress = Progress(cfg.num_train_steps, start_step, budget.seconds_left())
    acc, real_tokens, t_last = None, 0, time.time()
    nonfinite = NonFiniteGuard(cfg.nonfinite_updates)
    skipped, preempted = 0, False
    final: dict[str, float] = {}
    stopper = EarlyStopping(cfg.early_stopping_patience,
                            [r["eval/bleu"] for r in history if "eval/bleu" in r])

    def validate(step: int, state) -> bool | None:
      """Validation of `step`, its best checkpoint and early stopping: True = stop early;
      None = cut short by SIGTERM (marked, so the resumed run validates `step` first)."""
      faults.before_validation(step)
      try:
        bleu = validation.validate(evaluators, state.eval_params, step, writer,
                         cfg.decode.num_samples_to_log, final)
      except ValidationCancelled:
        log.warning("SIGTERM during the validation of step %d: validation stopped (the "
                    "resumed run does it first)", step)
        writer.write(step, {VALIDATION_CANCELLED: 1.0})
        return None
      plots.plot_metrics(workdir)
      best_ckpt.save(step, state, metrics={"bleu": bleu})
      if stopper.update(bleu):
        log.info("Early stopping at step %d: validation BLEU has not improved on %.2f for %d "
                 "evaluations", step, stopper.best, stopper.patience)
        return True
      return False

    step, first_step, out_of_time = start_step, start_step + 1, False
    if _validation_pending(history, start_step):
      log.info("Validating step %d first: SIGTERM cut its validation short", start_step)
      outcome = validate(start_step, state)
      preempted = outcome is None
      if outcome is not False:  # (preempted again, or stopping early: no more steps)
        first_step = cfg.num_train_steps + 1
    if budget.spent() and start_step < cfg.num_train_steps:
      log.warning("The time budget (config.time_budget_minutes=%g) was spent at step %d: no "
                  "more training; raise it to train on", cfg.time_budget_minutes, start_step)
      first_step = cfg.num_train_steps + 1
    for step in range(first_step, cfg.num_train_steps + 1):
      batch, real, stats = next(train_iter)
      real_tokens += real
      pipeline.count(stats)
      lr_scale = cooldown_scale(cfg.optimizer.cooldown_fraction, step, cfg.num_train_steps,
                                budget.minutes(), cfg.time_budget_minutes)
      state, step_metrics = p_train_step(state, batch, dropout_rng,
                                         *[np.float32(lr_scale)] * cooling)
      acc = sum_metrics(acc, step_metrics)
      faults.after_step(step)
      preempted = preemption.requested(step)
      out_of_time = budget.spent() and step < cfg.num_train_steps
      last = step == cfg.num_train_steps or preempted or out_of_time
      due_eval, due_save = (clock.due() if clock.active and step % cfg.log_every_steps == 0
                            else (False, False))
      saving = step % cfg.checkpoint_every_steps == 0 or last or due_save
      # (also at every save: a resumed run takes its data counts from the saved step's record)
      logging_now = step % cfg.log_every_steps == 0 or saving

      if logging_now:
        acc = jax.device_get(acc)
        nonfinite.check(acc, step, ckpt)  # (before anything is saved)
        skipped += nonfinite.report(acc)
        logged = _train_metrics(acc, time.time() - t_last, real_tokens,
                                float(lr_fn(step - 1)) * lr_scale, skipped, pipeline)
        logged["time/train_minutes"] = budget.minutes()
        if out_of_time:
          logged["train/time_budget_stop"] = 1.0
        writer.write(step, logged)
        progress.update(step, logged)
        acc, real_tokens, t_last = None, 0, time.time()

      if (step % cfg.eval_every_steps == 0 or last or due_eval) and not preempted:
        clock.done(0)
        outcome = validate(step, state)
        preempted = preempted or outcome is None
        last = last or outcome is not False
        t_last = time.time()  # evaluation time does not count against training speed

      if saving or last:  # (`last` again: early stopping may have set it)
        faults.before_save(step, ckpt.directory)
        ckpt.save(step, state, train_iter)
        clock.done(1)
        faults.after_save(step)
        t_last = time.time()
      if last:
        break

    progress.close()
    preemption.close()
    train_iter.close()
    if out_of_time and not preempted:
      log.warning("Time budget of %g minutes spent: training ended at step %d of %d (saved, "
                  "validated; rerun with a larger config.time_budget_minutes to go on)",
                  cfg.time_budget_minutes, step, cfg.num_train_steps)
      final["time_budget_stop_at_step"] = step
    log.info("Data: %s", pipeline.filter.summary())
    if preempted:
      log.warning("Preempted: checkpoint saved at step %d in %s; rerun the same command to "
                  "resume", step, ckpt.directory)
      final["preempted_at_step"] = step
    else:  # (the test sets: config.data.test_split and each corpus's; none when none is named)
      final.update(validation.test(cfg, workdir, model, state.eval_params, tok, mesh, writer,
                         int(jax.device_get(state.step))))
    plots.plot_metrics(workdir)
    writer.close()
    return final
  finally:  # (also on an error: a save in flight completes before the process ends)
    ckpt.close()
    best_ckpt.close()


def resolve_dtype(cfg: TrainConfig, config_dict: dict | None, workdir: Path
                  ) -> tuple[TrainConfig, dict | None]:
  """`cfg` and `config_dict` with config.model.dtype="auto" resolved (parallel.numerics): to
  the dtype recorded in the workdir's config.json when the run resumes, else to what this
  hardware runs fastest. The resolved value is what config.json records."""
  recorded = None
  if cfg.model.dtype == "auto" and (workdir / layout.CONFIG).is_file():
    recorded = layout.read_config(workdir).get("model", {}).get("dtype")
  choice = numerics.resolve(cfg.model.dtype, recorded)
  if cfg.model.dtype == "auto":
    log.info("config.model.dtype=auto resolved to %s: %s", choice.dtype, choice.reason)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=choice.dtype))
    if config_dict is not None:
      config_dict = {**config_dict, "model": {**config_dict["model"], "dtype": choice.dtype}}
  return cfg, config_dict


# What decides the order of the training batches besides the seed: a run resumes with the
# values it was trained with, as its checkpoints hold a position in that order.
DATA_ORDER_KEYS = ("pretokenize", "num_workers")


def keep_data_order(cfg: TrainConfig, config_dict: dict | None, workdir: Path
                    ) -> tuple[TrainConfig, dict | None]:
  """`cfg` with config.data's DATA_ORDER_KEYS taken from the workdir's config.json when the
  run resumes (a run from before a key existed gets what it then did: layout.ADDED_KEYS), with
  a warning naming each value that the command line or config file set otherwise."""
  if not (workdir / layout.CONFIG).is_file():
    return cfg, config_dict
  recorded = layout.read_config(workdir)["data"]
  changed = {k: recorded[k] for k in DATA_ORDER_KEYS if recorded[k] != getattr(cfg.data, k)}
  for key, value in changed.items():
    log.warning("config.data.%s=%r differs from the %r this run was trained with (%s): "
                "resuming with %r, which its checkpoints' data position belongs to; use "
                "another --workdir for a run with the new value", key, getattr(cfg.data, key),
                value, workdir / layout.CONFIG, value)
  if not changed:
    return cfg, config_dict
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **changed))
  if config_dict is not None:
    config_dict = {**config_dict, "data": {**config_dict["data"], **changed}}
  return cfg, config_dict


# Marks a validation that SIGTERM cut short, at its step in metrics.jsonl.
VALIDATION_CANCELLED = "eval/cancelled"


def _validation_pending(history: list[dict], step: int) -> bool:
  """Whether the validation of `step` was cut short and not done since."""
  at_step = [r for r in history if r["step"] == step]
  return (any(VALIDATION_CANCELLED in r for r in at_step)
          and not any("eval/bleu" in r for r in at_step))


def _last_logged(records: list[dict], key: str, default: float) -> float:
  """The newest value of `key` in metrics `records` (`default` if none has it)."""
  values = [r[key] for r in records if key in r]
  return values[-1] if values else default


def _restore_counts(pipeline, history: list[dict]):
  """The data counts of a resumed run: those logged at its checkpoint's step (pre-tokenized
  path; the text path counts what grain reads, from 0 in each run)."""
  if pipeline.epochs is None:
    return
  for key, field in (("data/filtered_empty", "empty"), ("data/filtered_too_long", "too_long"),
                     ("data/pairs_kept", "kept")):
    setattr(pipeline.filter, field, int(_last_logged(history, key, 0)))
  for field in ("pairs", "tokens"):
    setattr(pipeline.filter, f"corpus_{field}", np.asarray(
        [int(_last_logged(history, f"data/corpus/{name}/{field}", 0))
         for name in pipeline.corpus_names], np.int64))


def _train_metrics(acc, elapsed: float, real_tokens: int, learning_rate: float, skipped: int,
                   pipeline) -> dict[str, float]:
  """What is logged for the steps summed in `acc` (which took `elapsed` seconds)."""
  n = max(acc["num_tokens"], 1.0)
  data_filter = pipeline.filter
  epochs = {} if pipeline.epochs is None else {"data/epochs": pipeline.epochs,
                                               "data/pairs_kept": data_filter.kept}
  return {**epochs, **_corpus_metrics(pipeline),
          "train/loss": acc["loss_sum"] / n, "train/nll": acc["nll_sum"] / n,
          "train/grad_norm": acc["grad_norm"] / max(acc["steps"] - acc["nonfinite_steps"], 1.0),
          "train/learning_rate": learning_rate,
          "train/skipped_steps": skipped,
          "perf/tokens_per_sec": real_tokens * jax.process_count() / elapsed,
          "perf/steps_per_sec": acc["steps"] / elapsed,
          "data/filtered_examples": data_filter.filtered,
          "data/filtered_empty": data_filter.empty,
          "data/filtered_too_long": data_filter.too_long}


def _corpus_metrics(pipeline) -> dict[str, float]:
  """A mixture's per-corpus counts: pairs drawn, tokens given, epochs, share of the pairs."""
  counts = pipeline.filter
  total = max(int(counts.corpus_pairs.sum()), 1)
  out = {}
  for i, name in enumerate(pipeline.corpus_names):
    pairs = int(counts.corpus_pairs[i])
    out.update({f"data/corpus/{name}/pairs": pairs,
                f"data/corpus/{name}/tokens": int(counts.corpus_tokens[i]),
                f"data/corpus/{name}/epochs": pairs / max(pipeline.corpus_sizes[i], 1),
                f"data/corpus/{name}/share": pairs / total})
  return out
