"""A sweep worker: opens (or joins) the study, then claims and runs trials until none is left,
rewriting the report after each. Any number of workers, on one machine or many, share a study.

Each trial: `<workdir>/trials/NNNN/` (the training workdir, with `train.log`); with
`sweep.population = K`, K trials train as one population in `<workdir>/populations/NNNN/`,
each a member's workdir (`trials/NNNN` links to it). The sweep:
`results.csv`, `results.json`, `objective_vs_params.png`, `objective_by_trial.png` and
`best_command.sh`, rewritten after every trial (`report_only` rewrites them from storage).
A trial whose worker died (its heartbeat stopped) is marked failed and rerun in its own
workdir, so it resumes from its last checkpoint; SIGTERM or Ctrl-C on a worker does the same
at once.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from pathlib import Path

import ml_collections
import optuna
from optuna.trial import TrialState

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.errors import Interrupted, UsageError
from transformer_jax.sweeps import report
from transformer_jax.sweeps import study as study_lib
from transformer_jax.sweeps.trials import TrialRunner

log = logging.getLogger(__name__)


class _Terminated(KeyboardInterrupt):
  """SIGTERM on a worker (scheduler stop, preemption): handled like Ctrl-C."""


def _raise_terminated(signum, frame):
  del signum, frame
  raise _Terminated()


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
  """Where the study lives and how this worker runs its trials (the sweep CLI's flags)."""
  workdir: Path
  storage: str = ""              # Optuna storage URL; "" = sqlite:///<workdir>/study.db
  study_name: str = ""
  devices: str = ""              # accelerators for this worker's trials (CUDA_VISIBLE_DEVICES)
  heartbeat_interval: int = 10   # seconds between a running trial's heartbeats
  heartbeat_grace: int = 60      # a heartbeat older than this: the trial's worker is dead
  report_only: bool = False      # only rewrite the report from the study


def run_sweep(spec_config: ml_collections.ConfigDict, spec_path: str,
              config: ml_collections.ConfigDict, config_args: list[str],
              options: WorkerOptions) -> str:
  """Validates the spec (read from `spec_path`) against the training config, then works on
  the study (unless `report_only`); returns the results table. `config_args` (`--config=FILE`
  and its overrides) go to every trial; the spec file's name names the study unless
  `options.study_name` does."""
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  try:
    spec = sweep_spec.load_spec(spec_config, config)
  except sweep_spec.SweepError as e:
    raise sweep_spec.SweepError(f"sweep spec {spec_path}: {e}") from None
  if options.heartbeat_grace <= options.heartbeat_interval:
    raise UsageError(f"--heartbeat_grace={options.heartbeat_grace} must exceed "
                     f"--heartbeat_interval={options.heartbeat_interval}")
  workdir = Path(options.workdir).resolve()
  base_args = list(config_args)
  identity = {**spec.to_json(), "config": list(base_args)}
  if sweep_spec.shares_tokenizer(spec, config):
    # Every trial would train the same tokenizer: the first one trains it, the rest load it.
    base_args.append(f"--config.data.tokenizer_path={workdir / 'spm.model'}")
  workdir.mkdir(parents=True, exist_ok=True)
  storage = study_lib.open_storage(options.storage or f"sqlite:///{workdir / 'study.db'}",
                                   options.heartbeat_interval, options.heartbeat_grace,
                                   spec.max_retries)
  study = study_lib.open_study(storage, options.study_name or Path(spec_path).stem, spec,
                               identity)
  runner = TrialRunner(study, storage, spec, base_args, config, workdir, options.devices,
                       options.heartbeat_interval)
  if not options.report_only:
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
      ran = run_worker(study, storage, runner, workdir, options.heartbeat_interval)
    except KeyboardInterrupt:
      report.write(study, spec, workdir, runner.command)
      raise Interrupted("sweep interrupted; rerun the same command to continue it") from None
    log.info("This worker ran %d trial(s); the study is finished", ran)
  return report.write(study, spec, workdir, runner.command)


def run_worker(study, storage, runner: TrialRunner, workdir: Path, wait_s: float) -> int:
  """Claims and runs trials until none is waiting and none is running anywhere; returns the
  number this worker ran. Waiting for running trials lets a dead worker's trial (stale
  heartbeat) be failed and rerun here."""
  study_id = storage.get_study_id_from_name(study.study_name)
  ran, waiting_for = 0, None
  while True:
    optuna.storages.fail_stale_trials(study)
    if runner.spec.population > 1:
      claimed = study_lib.claim_population(study, storage, study_id, runner.spec)
      if claimed:
        runner.run_population(claimed)
        ran += len(claimed)
    else:
      claimed = study_lib.claim_next_trial(study, storage, study_id, runner.spec)
      if claimed is not None:
        runner.run(*claimed)
        ran += 1
    if claimed:
      report.write(study, runner.spec, workdir, runner.command)
      continue
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
      return ran
    numbers = [t.number for t in running]
    if numbers != waiting_for:
      log.info("No trial left to start; waiting for running trial(s) %s (other workers', or a "
               "dead worker's until its heartbeat is %ss old)",
               ", ".join(map(str, numbers)), storage.grace_period)
      waiting_for = numbers
    time.sleep(wait_s)
