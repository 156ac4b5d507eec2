"""Hyperparameter sweeps with Optuna: every trial is an ordinary `train.py` run.

  python -m transformer_jax.sweep --config=configs/tiny.py \
      --sweep=configs/sweeps/tiny_lr_warmup.py --workdir=runs/sweep_tiny \
      [--config.num_train_steps=40 ...] [--sweep.num_trials=12 ...] \
      [--storage=postgresql://user@host/db] [--devices=0,1]

The study lives in Optuna storage (default: SQLite `<workdir>/study.db`). Rerunning the same
command continues it; more workers (processes, machines) started with the same `--storage`
and study share it. The study's creator enqueues the whole budget as waiting trials (the grid
points, or empty slots the sampler fills when a trial starts), and each worker claims one at
a time in a database transaction, so no trial runs twice and the budget is exact. A trial
whose worker died (its heartbeat stopped) is marked failed and rerun in its own workdir, so it
resumes from its last checkpoint; Ctrl-C or SIGTERM on a worker does the same at once.

Each trial: `<workdir>/trials/NNNN/` (the training workdir, with `train.log`). The sweep:
`results.csv`, `results.json`, `objective_vs_params.png`, `objective_by_trial.png` and
`best_command.sh`, rewritten after every trial (`--report_only` rewrites them from storage).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from transformer_jax import sweep_report, sweep_spec
from transformer_jax.metrics import log_to_stderr, read_metrics

log = logging.getLogger("transformer_jax.sweep")  # (also when run as __main__)

TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"


class SweepInterrupted(KeyboardInterrupt):
  """SIGTERM on a worker (scheduler stop, preemption): handled like Ctrl-C."""


# ---------------------------------------------------------------------------------- storage
def open_storage(url: str, heartbeat_interval: int, grace_period: int, max_retries: int):
  """Optuna RDB storage with heartbeats (a dead worker's trial is failed and retried).

  SQLite: transactions start with BEGIN IMMEDIATE, so a read-check-write such as claiming a
  waiting trial is atomic across processes (pysqlite otherwise reads outside a transaction
  and two workers can both claim the same trial).
  """
  import optuna
  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  is_sqlite = url.startswith("sqlite")
  # Workers starting together would race to create the tables (and the schema version row).
  lock = (_file_lock(url.removeprefix("sqlite:///") + ".lock") if is_sqlite
          else contextlib.nullcontext())
  with lock:
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": 120}} if is_sqlite else None,
        heartbeat_interval=heartbeat_interval, grace_period=grace_period,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
            max_retry=max_retries))
  if is_sqlite:
    _serializable_sqlite(storage.engine)
  return storage


@contextlib.contextmanager
def _file_lock(path: str):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _serializable_sqlite(engine):
  from sqlalchemy import event

  @event.listens_for(engine, "connect")
  def _no_implicit_transactions(dbapi_connection, _):
    dbapi_connection.isolation_level = None  # SQLAlchemy's BEGIN (below) is the only one

  @event.listens_for(engine, "begin")
  def _begin_immediate(connection):
    connection.exec_driver_sql("BEGIN IMMEDIATE")

  engine.dispose()  # connections made before the hooks existed


def _make_sampler(spec: sweep_spec.SweepSpec, seed: int):
  import optuna
  if spec.sampler == "tpe":
    # constant_liar: running trials count as bad, so parallel workers spread out.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
  return optuna.samplers.RandomSampler(seed=seed)  # grid points are fixed when enqueued


def _make_pruner(spec: sweep_spec.SweepSpec):
  import optuna
  if spec.pruner == "median":
    return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner_startup_trials,
                                       n_warmup_steps=spec.pruner_warmup_steps)
  if spec.pruner == "hyperband":
    return optuna.pruners.HyperbandPruner(min_resource=max(1, spec.pruner_warmup_steps))
  if spec.pruner == "successive_halving":
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, spec.pruner_warmup_steps))
  return optuna.pruners.NopPruner()


def open_study(storage, name: str, spec: sweep_spec.SweepSpec, identity: dict,
               wait_s: float = 120.0):
  """Creates the study and enqueues its budget, or joins it (refusing a different sweep)."""
  import optuna
  sampler, pruner = _make_sampler(spec, spec.seed), _make_pruner(spec)
  try:
    study = optuna.create_study(storage=storage, study_name=name, direction=spec.direction,
                                sampler=sampler, pruner=pruner)
  except optuna.exceptions.DuplicatedStudyError:
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    _wait_until_ready(study, wait_s)
    saved = study.user_attrs["sweep"]
    if saved != json.loads(json.dumps(identity)):
      diff = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
      raise sweep_spec.SweepError(
          f"study {name!r} in {storage.url} was made by a different sweep (differs in: "
          f"{', '.join(diff)}); use a new --workdir or --study_name, or the original settings")
    log.info("Joined study %r (%d trials so far)", name, len(study.trials))
    return study
  study.set_user_attr("sweep", identity)
  points = spec.grid_points if spec.sampler == "grid" else [{}] * spec.num_trials
  for point in points:
    study.enqueue_trial(point)
  study.set_user_attr("ready", True)
  log.info("Created study %r: %d trials queued (%s sampler)", name, len(points), spec.sampler)
  return study


def _wait_until_ready(study, wait_s: float):
  deadline = time.time() + wait_s
  while not study.user_attrs.get("ready"):
    if time.time() > deadline:
      raise sweep_spec.SweepError(
          f"study {study.study_name!r} exists but its trials were never queued (its creator "
          "stopped during setup); delete it (`optuna delete-study`) or use a new --study_name")
    time.sleep(0.5)  # user_attrs are read from the storage on each access


def claim_next_trial(study, storage, study_id: int, spec: sweep_spec.SweepSpec):
  """Atomically moves one waiting trial to RUNNING; returns (trial, trial_id), or None when
  no trial is waiting."""
  import optuna
  from optuna.trial import TrialState
  for frozen in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
    try:
      if not storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
        continue  # another worker took it first
    except optuna.exceptions.UpdateFinishedTrialError:
      continue
    storage.record_heartbeat(trial_id)
    # Seeded per trial: workers sampling at the same moment do not draw the same values.
    study.sampler = _make_sampler(spec, spec.seed + frozen.number)
    return optuna.trial.Trial(study, trial_id), trial_id
  return None


# ------------------------------------------------------------------------------------ trials
def _die_with_parent():
  """Linux: the trial gets SIGTERM if its worker dies (no orphan training in the workdir)."""
  with contextlib.suppress(Exception):
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class TrialRunner:
  """Runs trials as `train.py` subprocesses, reporting validation metrics for pruning."""

  def __init__(self, study, storage, spec: sweep_spec.SweepSpec, base_args: list[str],
               override_of, workdir: Path, devices: str, heartbeat_interval: float,
               poll_s: float = 1.0):
    self.study, self.storage, self.spec = study, storage, spec
    self.base_args, self.override_of = base_args, override_of
    self.workdir, self.devices = workdir, devices
    self.heartbeat_interval, self.poll_s = heartbeat_interval, poll_s

  def command(self, params: dict, trial_dir: Path | str) -> list[str]:
    """The trial's full command line: the base config, its overrides, the spec's fixed
    values, the trial's values, and the trial's workdir."""
    args = [self.override_of(k, v) for k, v in {**self.spec.fixed, **params}.items()]
    return [sys.executable, str(TRAIN_PY), *self.base_args, *args, f"--workdir={trial_dir}"]

  def env(self) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if self.devices:
      env["CUDA_VISIBLE_DEVICES"] = self.devices  # NVIDIA
      env["HIP_VISIBLE_DEVICES"] = self.devices   # AMD
    return env

  def run(self, trial, trial_id: int) -> None:
    """Runs one claimed trial to the end and tells Optuna how it went."""
    import optuna
    from optuna.trial import TrialState
    history = optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(
        trial.study.get_trials(deepcopy=False)[trial.number])
    root = history[0] if history else trial.number  # a rerun resumes in the original workdir
    trial_dir = self.workdir / "trials" / f"{root:04d}"
    params = {name: _suggest(trial, name, dist) for name, dist in self.spec.search_space.items()}
    cmd = self.command(params, trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    for key, value in (("workdir", str(trial_dir)), ("command", shlex.join(cmd)),
                       ("host", socket.gethostname()), ("pid", os.getpid()),
                       ("devices", self.devices), ("retry_of", history[-1] if history else None)):
      trial.set_user_attr(key, value)
    what = ", ".join(f"{k}={v}" for k, v in params.items())
    log.info("trial %d%s: %s -> %s", trial.number,
             f" (rerun of {history[-1]}, resuming its workdir)" if history else "", what,
             trial_dir)

    start = time.time()
    reported: set[int] = set()
    pruned_at = None
    with (trial_dir / "train.log").open("a") as out:
      proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                              preexec_fn=_die_with_parent)
    try:
      last_beat = time.time()
      while proc.poll() is None:
        time.sleep(self.poll_s)
        if time.time() - last_beat >= self.heartbeat_interval:
          self.storage.record_heartbeat(trial_id)
          last_beat = time.time()
        pruned_at = self._report(trial, trial_dir, reported)
        if pruned_at is not None:
          _stop(proc)
          break
      if pruned_at is None:
        pruned_at = self._report(trial, trial_dir, reported)
    except KeyboardInterrupt:
      _stop(proc)
      self._interrupted(trial, time.time() - start)
      raise

    seconds = time.time() - start
    records = read_metrics(trial_dir / "metrics.jsonl")
    steps = max((r["step"] for r in records), default=0)
    trial.set_user_attr("wall_time_s", round(seconds, 1))
    trial.set_user_attr("steps", steps)
    if pruned_at is not None:
      self.study.tell(trial, state=TrialState.PRUNED)
      log.info("trial %d pruned at step %d (%.0fs)", trial.number, pruned_at, seconds)
      return
    value = objective_value(records, self.spec)
    if proc.returncode != 0 or value is None:
      reason = (f"train.py exited with status {proc.returncode}" if proc.returncode
                else f"the run logged no {self.spec.objective}")
      trial.set_user_attr("error", f"{reason}: {_tail(trial_dir / 'train.log')}")
      self.study.tell(trial, state=TrialState.FAIL)
      log.warning("trial %d failed (%s); see %s", trial.number, reason,
                  trial_dir / "train.log")
      return
    self.study.tell(trial, value)
    log.info("trial %d: %s=%.4f after %d steps (%.0fs)", trial.number, self.spec.objective,
             value, steps, seconds)

  def _report(self, trial, trial_dir: Path, reported: set[int]) -> int | None:
    """Reports new validation results; returns the step if the pruner stops the trial."""
    key = self.spec.intermediate_metric
    for record in read_metrics(trial_dir / "metrics.jsonl"):
      step = record["step"]
      if key in record and step not in reported:
        reported.add(step)
        trial.report(record[key], step)
        if trial.should_prune():
          return step
    return None

  def _interrupted(self, trial, seconds: float):
    """Ctrl-C / SIGTERM: fail the trial and queue its rerun (it resumes from its checkpoint)."""
    from optuna.trial import TrialState
    trial.set_user_attr("wall_time_s", round(seconds, 1))
    trial.set_user_attr("error", "worker interrupted")
    frozen = self.study.tell(trial, state=TrialState.FAIL)
    callback = self.storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
      callback(self.study, frozen)
    log.warning("trial %d interrupted: marked failed and queued to rerun", trial.number)


def _suggest(trial, name: str, dist: sweep_spec.Distribution):
  if isinstance(dist, sweep_spec.Choice):
    return trial.suggest_categorical(name, dist.values)
  if isinstance(dist, sweep_spec.Uniform):
    return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
  return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)


def objective_value(records: list[dict], spec: sweep_spec.SweepSpec) -> float | None:
  values = [r[spec.objective] for r in records if spec.objective in r]
  if not values:
    return None
  if spec.reduce == "last":
    return values[-1]
  return max(values) if spec.direction == "maximize" else min(values)


def _stop(proc: subprocess.Popen, timeout_s: float = 60.0):
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def _tail(path: Path, lines: int = 5) -> str:
  try:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
  except OSError:
    return ""


# ------------------------------------------------------------------------------------ worker
def run_worker(study, storage, runner: TrialRunner, workdir: Path, wait_s: float) -> int:
  """Claims and runs trials until none is waiting and none is running anywhere; returns the
  number this worker ran. Waiting for running trials lets a dead worker's trial (stale
  heartbeat) be failed and rerun here."""
  import optuna
  from optuna.trial import TrialState
  study_id = storage.get_study_id_from_name(study.study_name)
  ran, waiting_for = 0, None
  while True:
    optuna.storages.fail_stale_trials(study)
    claimed = claim_next_trial(study, storage, study_id, runner.spec)
    if claimed is not None:
      runner.run(*claimed)
      ran += 1
      sweep_report.write(study, runner.spec, workdir, runner.command)
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


# --------------------------------------------------------------------------------------- CLI
FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Base training config (configs/*.py); "
                                "--config.KEY=VALUE overrides apply to every trial.",
                                lock_config=True)
config_flags.DEFINE_config_file("sweep", None, "Sweep spec (configs/sweeps/*.py); "
                                "--sweep.KEY=VALUE overrides it.", lock_config=True)
flags.DEFINE_string("workdir", None, "Sweep folder: trials/, results, plots, the SQLite study.")
flags.DEFINE_string("storage", "", "Optuna storage URL shared by all workers, e.g. "
                    "postgresql://user:pass@host/db; default sqlite:///<workdir>/study.db.")
flags.DEFINE_string("study_name", "", "Study name in the storage; default: the sweep file's "
                    "name.")
flags.DEFINE_string("devices", "", "Pin this worker's trials to these accelerators "
                    "(CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES), e.g. 0,1.")
flags.DEFINE_integer("heartbeat_interval", 10, "Seconds between a running trial's heartbeats.")
flags.DEFINE_integer("heartbeat_grace", 60, "A running trial whose heartbeat is older than "
                     "this is taken to be dead: failed, and rerun from its checkpoint.")
flags.DEFINE_bool("report_only", False, "Only rewrite the results table and plots.")
flags.mark_flags_as_required(["config", "sweep", "workdir"])


def _config_overrides(argv: list[str]) -> list[str]:
  """The `--config...` arguments of this command line, passed on to every trial."""
  out = []
  for arg in argv[1:]:
    if arg.startswith("--config=") or arg.startswith("--config."):
      if "=" not in arg:
        raise app.UsageError(f"{arg}: write config overrides as --config.KEY=VALUE")
      out.append(arg)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  _setup_logging()
  workdir = Path(FLAGS.workdir).resolve()
  try:
    spec = sweep_spec.load_spec(FLAGS.sweep, FLAGS.config)
  except sweep_spec.SweepError as e:
    sys.exit(f"sweep error ({config_flags.get_config_filename(FLAGS['sweep'])}): {e}")
  if FLAGS.heartbeat_grace <= FLAGS.heartbeat_interval:
    raise app.UsageError(f"--heartbeat_grace={FLAGS.heartbeat_grace} must exceed "
                         f"--heartbeat_interval={FLAGS.heartbeat_interval}")
  if not TRAIN_PY.is_file():
    sys.exit(f"{TRAIN_PY} not found: run sweeps from a source checkout")

  base_args = _config_overrides(sys.argv)
  name = FLAGS.study_name or Path(config_flags.get_config_filename(FLAGS["sweep"])).stem
  identity = {**spec.to_json(), "config": list(base_args)}
  if sweep_spec.shares_tokenizer(spec, FLAGS.config):
    # Every trial would train the same tokenizer: the first one trains it, the rest load it.
    base_args.append(f"--config.data.tokenizer_path={workdir / 'spm.model'}")
  workdir.mkdir(parents=True, exist_ok=True)
  url = FLAGS.storage or f"sqlite:///{workdir / 'study.db'}"
  storage = open_storage(url, FLAGS.heartbeat_interval, FLAGS.heartbeat_grace,
                         spec.max_retries)
  try:
    study = open_study(storage, name, spec, identity)
  except sweep_spec.SweepError as e:
    sys.exit(f"sweep error: {e}")
  runner = TrialRunner(study, storage, spec, base_args,
                       lambda k, v: sweep_spec.format_override(FLAGS.config, k, v),
                       workdir, FLAGS.devices, FLAGS.heartbeat_interval)
  if not FLAGS.report_only:
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
      ran = run_worker(study, storage, runner, workdir, FLAGS.heartbeat_interval)
    except KeyboardInterrupt:
      sweep_report.write(study, spec, workdir, runner.command)
      sys.exit("sweep interrupted; rerun the same command to continue it")
    log.info("This worker ran %d trial(s); the study is finished", ran)
  print(sweep_report.write(study, spec, workdir, runner.command), flush=True)


def _raise_interrupted(signum, frame):
  raise SweepInterrupted()


def _setup_logging():
  import optuna
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  log_to_stderr()


def run():
  app.run(main)


if __name__ == "__main__":
  run()
