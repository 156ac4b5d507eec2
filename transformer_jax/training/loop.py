"""The training loop: resume from the workdir, train with periodic logging, validation and
checkpoints, stop on preemption or early stopping, and score the test split at the end."""

from __future__ import annotations

import logging
from pathlib import Path

from transformer_jax.config.sections import TrainConfig
from transformer_jax.training.population_run import PopulationRun
from transformer_jax.training.run import Run, open_run
from transformer_jax.workdir import layout, lock

log = logging.getLogger(__name__)


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
  """The driver: each step's update, then what `run.decisions` says follows it."""
  run_type = PopulationRun if cfg.population.size else Run
  with open_run(cfg, workdir, config_dict, run_type) as run:
    step, stop, actions = run.start_step, run.begin(), None
    while not stop:
      step += 1
      actions = run.train(step)
      if actions.log:
        run.log_train(step, actions)
      if actions.validate:
        actions = actions.after_validation(run.validate(step))
      if actions.save:
        run.save(step)
      stop = actions.last
    return run.finish(step, out_of_time=actions is not None and actions.out_of_time)
