"""The study of a sweep in Optuna storage (SQLite or a database server shared by all workers):
opened or joined, its whole budget queued when created, and waiting trials claimed one at a
time in a database transaction, so no trial runs twice and the budget is exact."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
import warnings

import optuna
import sqlalchemy
from optuna.trial import TrialState
from sqlalchemy import event

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.errors import UsageError

log = logging.getLogger(__name__)


def open_storage(url: str, heartbeat_interval: int, grace_period: int, max_retries: int):
  """Optuna RDB storage with heartbeats (a dead worker's trial is failed and retried).

  SQLite: transactions start with BEGIN IMMEDIATE, so a read-check-write such as claiming a
  waiting trial is atomic across processes (pysqlite otherwise reads outside a transaction
  and two workers can both claim the same trial).
  """
  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  is_sqlite = url.startswith("sqlite")
  if not is_sqlite:
    check_server_url(url)
  # Workers starting together would race to create the tables (and the schema version row).
  lock = (_file_lock(url.removeprefix("sqlite:///") + ".lock") if is_sqlite
          else _server_lock(url))
  with _server_errors(url, is_sqlite), lock:
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": 120}} if is_sqlite else None,
        heartbeat_interval=heartbeat_interval, grace_period=grace_period,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
            max_retry=max_retries))
  if is_sqlite:
    _serializable_sqlite(storage.engine)
  return storage


# What to install for each database URL form (SQLAlchemy's default driver of postgresql:// is
# psycopg 3; postgresql+psycopg2:// takes psycopg2).
DRIVERS = {"psycopg": "pip install 'psycopg[binary]' (or use postgresql+psycopg2:// with "
                      "pip install psycopg2-binary)",
           "psycopg2": "pip install psycopg2-binary", "pymysql": "pip install pymysql",
           "mysqldb": "pip install mysqlclient"}


def check_server_url(url: str):
  """A UsageError (one line, password hidden) unless `url` is a database URL whose driver is
  installed."""
  try:
    parsed = sqlalchemy.engine.make_url(url)
  except sqlalchemy.exc.ArgumentError:
    raise UsageError(f"--storage={url}: not a database URL (e.g. sqlite:///sweep.db or "
                     "postgresql+psycopg2://USER:PASSWORD@HOST:5432/DB)") from None
  shown = parsed.render_as_string(hide_password=True)
  try:
    parsed.get_dialect().import_dbapi()
  except ImportError:
    driver = parsed.get_driver_name()
    raise UsageError(f"--storage={shown}: its driver {driver!r} (for "
                     f"{parsed.drivername}://) is not installed; "
                     f"{DRIVERS.get(driver, f'install {driver}')}") from None
  except sqlalchemy.exc.NoSuchModuleError:
    raise UsageError(f"--storage={shown}: SQLAlchemy knows no database "
                     f"{parsed.drivername!r}") from None


@contextlib.contextmanager
def _server_errors(url: str, is_sqlite: bool):
  """A database server that cannot be reached or refuses the login: one line naming the host
  (the study is untouched: nothing was written)."""
  try:
    yield
  except sqlalchemy.exc.OperationalError as e:
    if is_sqlite:
      raise
    parsed = sqlalchemy.engine.make_url(url)
    reason = str(e.orig or e).strip().splitlines()[0][:200]
    raise UsageError(f"--storage={parsed.render_as_string(hide_password=True)}: cannot "
                     f"connect to {parsed.host}:{parsed.port or 'default port'}: {reason}"
                     ) from None


@contextlib.contextmanager
def _server_lock(url: str):
  """On PostgreSQL, a session advisory lock held while the storage is set up (its tables
  created once, whoever starts first); other servers: none."""
  if sqlalchemy.engine.make_url(url).get_backend_name() != "postgresql":
    yield
    return
  engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
  try:
    with engine.connect() as connection:
      connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": _LOCK_KEY})
      try:
        yield
      finally:
        connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"),
                           {"key": _LOCK_KEY})
  finally:
    engine.dispose()


_LOCK_KEY = 0x7472616E73  # (an arbitrary 64-bit key: "trans")


@contextlib.contextmanager
def _file_lock(path: str):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _serializable_sqlite(engine):
  @event.listens_for(engine, "connect")
  def _no_implicit_transactions(dbapi_connection, _):
    dbapi_connection.isolation_level = None  # SQLAlchemy's BEGIN (below) is the only one

  @event.listens_for(engine, "begin")
  def _begin_immediate(connection):
    connection.exec_driver_sql("BEGIN IMMEDIATE")

  engine.dispose()  # connections made before the hooks existed


def _make_sampler(spec: sweep_spec.SweepSpec, seed: int):
  if spec.sampler == "tpe":
    # constant_liar: running trials count as bad, so parallel workers spread out.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
  # (grid points, and a random sweep's points of a finite space, are fixed when enqueued)
  return optuna.samplers.RandomSampler(seed=seed)


def _make_pruner(spec: sweep_spec.SweepSpec):
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
  points = spec.queued_points()
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
  for frozen in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
    trial_id = _claim(storage, study_id, frozen)
    if trial_id is not None:
      return _sampling_trial(study, spec, frozen, trial_id), trial_id
  return None


def claim_population(study, storage, study_id: int, spec: sweep_spec.SweepSpec
                     ) -> list[tuple[optuna.Trial, int, dict]]:
  """Claims up to `spec.population` waiting trials to train as one population and draws
  their values; returns [(trial, trial_id, params)], [] when none is waiting.

  A killed population's reruns come first, all of them together (they resume its run);
  they are recognised by the population their original trials recorded. New trials share
  the values of `spec.shared_paths`: the first trial's, drawn or queued; a queued point
  with other shared values waits for another population."""
  waiting = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,))
  reruns = [t for t in waiting if t.user_attrs.get("population")]
  if reruns:
    group = [t for t in reruns if t.user_attrs["population"] == reruns[0].user_attrs["population"]]
    claimed = [(t, trial_id) for t in group
               if (trial_id := _claim(storage, study_id, t)) is not None]
    if claimed:
      return [(_sampling_trial(study, spec, t, trial_id), trial_id, t.params)
              for t, trial_id in claimed]
  claimed, shared = [], None
  for frozen in waiting:
    if frozen.user_attrs.get("population"):
      continue
    known = {**frozen.params, **frozen.system_attrs.get("fixed_params", {})}
    if shared is not None and any(known.get(k, v) != v for k, v in shared.items()):
      continue
    trial_id = _claim(storage, study_id, frozen)
    if trial_id is None:
      continue
    if shared:
      storage.set_trial_system_attr(trial_id, "fixed_params", {
          **frozen.system_attrs.get("fixed_params", {}), **shared})
    trial = _sampling_trial(study, spec, frozen, trial_id)
    params = sample(trial, spec)
    if shared is None:
      shared = {path: params[path] for path in spec.shared_paths}
    claimed.append((trial, trial_id, params))
    if len(claimed) == spec.population:
      break
  return claimed


def _claim(storage, study_id: int, frozen) -> int | None:
  """Trial `frozen` moved from WAITING to RUNNING (its heartbeat started); its id, or None
  if another worker took it first."""
  trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
  try:
    if not storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
      return None
  except optuna.exceptions.UpdateFinishedTrialError:
    return None
  storage.record_heartbeat(trial_id)
  return trial_id


def _sampling_trial(study, spec: sweep_spec.SweepSpec, frozen, trial_id: int) -> optuna.Trial:
  # Seeded per trial: workers sampling at the same moment do not draw the same values.
  study.sampler = _make_sampler(spec, spec.seed + frozen.number)
  return optuna.trial.Trial(study, trial_id)


def sample(trial: optuna.Trial, spec: sweep_spec.SweepSpec) -> dict:
  """The trial's value of every swept key: queued, drawn before (a rerun), or drawn now."""
  return {name: _suggest(trial, name, dist) for name, dist in spec.search_space.items()}


def _suggest(trial, name: str, dist: sweep_spec.Distribution):
  if isinstance(dist, sweep_spec.Choice):
    return trial.suggest_categorical(name, dist.values)
  if isinstance(dist, sweep_spec.Uniform):
    return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
  return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
