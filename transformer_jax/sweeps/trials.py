"""One trial of a sweep: an ordinary training run (`transformer_jax.cli.train` in a subprocess)
with the trial's config overrides, its validation metrics reported to Optuna's pruner as they
appear, and its outcome (complete, pruned, failed) told to the study."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import optuna
from optuna.trial import TrialState

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.config.parse import from_config_dict
from transformer_jax.config.population import MEMBER_PATHS
from transformer_jax.reporting.metrics import METRICS_FILE, read_metrics
from transformer_jax.sweeps import study as study_lib
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)

TRAIN = [sys.executable, "-m", "transformer_jax.cli.train"]  # a trial's command, before its flags


def _die_with_parent():
  """Linux: the trial gets SIGTERM if its worker dies (no orphan training in the workdir)."""
  with contextlib.suppress(Exception):
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


RETRY_WAIT_S = 3600  # the longest a trial waits for an orphaned run in its workdir


@dataclasses.dataclass
class Claim:
  """A trial this worker runs: its values and where its run writes its metrics (its own
  workdir, or its member's in a population's)."""
  trial: optuna.Trial
  trial_id: int
  params: dict
  workdir: Path
  member: int | None = None  # its index in a population
  reported: set = dataclasses.field(default_factory=set)
  told: bool = False  # its outcome told to Optuna


class TrialRunner:
  """Runs trials as training subprocesses, one trial a run or `spec.population` trials as
  one population, reporting validation metrics for pruning (read every `poll_s` seconds: a
  pruned trial is stopped within that time of its report, a pruned member at its
  population's next validation)."""

  def __init__(self, study, storage, spec: sweep_spec.SweepSpec, base_args: list[str],
               base: ml_collections.ConfigDict, workdir: Path, devices: str,
               heartbeat_interval: float, poll_s: float = 0.25):
    self.study, self.storage, self.spec = study, storage, spec
    self.base_args, self.base = base_args, base
    self.workdir, self.devices = workdir, devices
    self.heartbeat_interval, self.poll_s = heartbeat_interval, poll_s

  def _override(self, path: str, value) -> str:
    return sweep_spec.format_override(self.base, path, value)

  def command(self, params: dict, trial_dir: Path | str) -> list[str]:
    """The trial's full command line: the base config, its overrides, the spec's fixed
    values, the trial's values, and the trial's workdir. A population member's trains it
    alone as its population trained it (the population's batch order)."""
    values = {**self.spec.fixed, **params}
    if self.spec.population > 1:
      values["data_seed"] = self._batch_seed(params)
    args = [self._override(k, v) for k, v in values.items()]
    return [*TRAIN, *self.base_args, *args, f"--workdir={trial_dir}"]

  def _batch_seed(self, params: dict) -> int:
    """The data order of a population with these shared values (the members' own seeds
    are not the population's)."""
    shared = {k: v for k, v in params.items() if k not in self.spec.member_paths}
    return from_config_dict(sweep_spec.with_overrides(
        self.base, {**self.spec.fixed, **shared})).batch_seed

  def population_command(self, members: list[dict], population_dir: Path) -> list[str]:
    """The command training `members` (each one's swept values) as one population."""
    args = [self._override(k, v) for k, v in {**self.spec.fixed, **members[0]}.items()
            if k not in self.spec.member_paths]
    for path in self.spec.member_paths:
      values = ",".join(str(m[path]) for m in members)
      args.append(f"--config.population.{MEMBER_PATHS[path]}=({values},)")
    return [*TRAIN, *self.base_args, *args, f"--workdir={population_dir}"]

  def env(self) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if self.devices:
      env["CUDA_VISIBLE_DEVICES"] = self.devices  # NVIDIA
      env["HIP_VISIBLE_DEVICES"] = self.devices   # AMD
    return env

  def run(self, trial, trial_id: int) -> None:
    """Runs one claimed trial to the end and tells Optuna how it went."""
    history = _retry_history(trial)
    trial_dir = self._trial_dir(trial, history[0] if history else None)
    claim = Claim(trial, trial_id, study_lib.sample(trial, self.spec), trial_dir)
    cmd = self.command(claim.params, trial_dir)
    self._record(claim, cmd, history)
    self._supervise([claim], cmd, trial_dir)

  def run_population(self, claimed: list[tuple]) -> None:
    """Runs claimed trials (`study.claim_population`) as one population's members to the
    end: new trials as a new population in `populations/NNNN` (NNNN its first trial's
    number; `trials/MMMM` links to each member's workdir), the reruns of a killed
    population resuming its run with every member it had."""
    first = claimed[0][0]
    if "population" in first.user_attrs:  # (reruns: the original trials' records)
      numbers = first.user_attrs["members"]
      trials = self.study.get_trials(deepcopy=False)
      members = [trials[n].params for n in numbers]
      population_dir = Path(first.user_attrs["population"])
      if not population_dir.is_dir():
        log.warning("population %s is not on this machine; its members start over",
                    population_dir)
        population_dir = self.workdir / "populations" / f"{first.number:04d}"
      indices = [t.user_attrs["member"] for t, _, _ in claimed]
      self._stop_finished_members(first.user_attrs["population"], population_dir, numbers,
                                  set(indices))
    else:
      numbers = [t.number for t, _, _ in claimed]
      members = [params for _, _, params in claimed]
      population_dir = self.workdir / "populations" / f"{numbers[0]:04d}"
      indices = range(len(claimed))
    claims = [Claim(t, trial_id, params, layout.member_dir(population_dir, i), i)
              for (t, trial_id, params), i in zip(claimed, indices)]
    cmd = self.population_command(members, population_dir)
    log.info("population %s: trials %s as members %s", population_dir.name,
             ", ".join(str(c.trial.number) for c in claims),
             ", ".join(str(c.member) for c in claims))
    for c in claims:
      history = _retry_history(c.trial)
      # ("population" last: a rerun is recognised by it, and then has the others)
      self._record(c, self.command(c.params, c.workdir), history, members=numbers,
                   member=c.member, population=str(population_dir))
      link = self.workdir / "trials" / f"{c.trial.number:04d}"
      if not history and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(c.workdir, link.parent))
    self._supervise(claims, cmd, population_dir)

  def _stop_finished_members(self, recorded_dir: str, population_dir: Path,
                             numbers: list[int], claimed: set[int]):
    """Members of a rerun population whose trials are over (pruned, complete, or failed
    with no rerun left) asked to stop: nobody reports them any more. Those whose reruns
    wait or run elsewhere go on (that worker waits for this run's workdir lock)."""
    pending = {t.user_attrs.get("member") for t in self.study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        if t.user_attrs.get("population") == recorded_dir}
    for i, number in enumerate(numbers):
      if i not in claimed and i not in pending:
        layout.request_stop(layout.member_dir(population_dir, i),
                            f"trial {number}'s run is over")

  def _record(self, claim: Claim, cmd: list[str], history: list[int], **more):
    """The trial's user attributes: where it runs, its command, the worker's host."""
    attrs = {"workdir": str(claim.workdir), "command": shlex.join(cmd),
             "host": socket.gethostname(), "pid": os.getpid(), "devices": self.devices,
             "retry_of": history[-1] if history else None, **more}
    for key, value in attrs.items():
      claim.trial.set_user_attr(key, value)
    what = ", ".join(f"{k}={v}" for k, v in claim.params.items())
    log.info("trial %d%s: %s -> %s", claim.trial.number,
             f" (rerun of {history[-1]}, resuming its workdir)" if history else "", what,
             claim.workdir)

  def _supervise(self, claims: list[Claim], cmd: list[str], run_dir: Path) -> None:
    """Runs `cmd` (logging to run_dir/train.log), beating each trial's heartbeat and
    reporting its validation results, until the run ends or every trial is pruned; then
    tells Optuna each trial's outcome."""
    start = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "train.log").open("a") as out:
      # (a retried trial waits for its workdir while a dead worker's orphaned run finishes:
      # never two writers in one trial workdir)
      proc = subprocess.Popen([*cmd, f"--wait_for_workdir={RETRY_WAIT_S}"], stdout=out,
                              stderr=subprocess.STDOUT, env=self.env(),
                              preexec_fn=_die_with_parent)
    live = list(claims)
    try:
      last_beat = time.time()
      while proc.poll() is None:
        time.sleep(self.poll_s)
        if time.time() - last_beat >= self.heartbeat_interval:
          for c in live:
            self.storage.record_heartbeat(c.trial_id)
          last_beat = time.time()
        live = [c for c in live if not self._pruned(c, start)]
        if not live:
          _stop(proc)
      live = [c for c in live if not self._pruned(c, start)]
    except KeyboardInterrupt:
      with _no_more_signals():  # (a second SIGTERM/Ctrl-C must not skip the bookkeeping)
        _stop(proc)
        for c in live:
          if not c.told:
            self._interrupted(c.trial, time.time() - start)
      raise
    for c in live:
      self._finish(c, proc.returncode, time.time() - start, run_dir / "train.log")

  def _pruned(self, claim: Claim, start: float) -> bool:
    """Reports the trial's new validation results; if the pruner stops it: told so (a
    member asked to stop), True."""
    step = self._report(claim.trial, claim.workdir, claim.reported)
    if step is None:
      return False
    self._set_outcome_attrs(claim, time.time() - start)
    claim.told = True
    self.study.tell(claim.trial, state=TrialState.PRUNED)
    if claim.member is not None:  # (after the tell: a pruned trial is never rerun)
      layout.request_stop(claim.workdir, f"pruned by the sweep at step {step}, trial "
                                         f"{claim.trial.number}")
    log.info("trial %d pruned at step %d (%.0fs)", claim.trial.number, step,
             time.time() - start)
    return True

  def _set_outcome_attrs(self, claim: Claim, seconds: float) -> list[dict]:
    records = read_metrics(claim.workdir / METRICS_FILE)
    claim.trial.set_user_attr("wall_time_s", round(seconds, 1))
    claim.trial.set_user_attr("steps", max((r["step"] for r in records), default=0))
    return records

  def _finish(self, claim: Claim, returncode: int, seconds: float, log_path: Path):
    trial = claim.trial
    records = self._set_outcome_attrs(claim, seconds)
    value = objective_value(records, self.spec)
    if returncode != 0 or value is None:
      reason = (f"training exited with status {returncode}" if returncode
                else f"the run logged no {self.spec.objective}")
      trial.set_user_attr("error", f"{reason}: {_tail(log_path)}")
      self.study.tell(trial, state=TrialState.FAIL)
      log.warning("trial %d failed (%s); see %s", trial.number, reason, log_path)
      return
    self.study.tell(trial, value)
    log.info("trial %d: %s=%.4f after %d steps (%.0fs)", trial.number, self.spec.objective,
             value, trial.user_attrs["steps"], seconds)

  def _trial_dir(self, trial, original: int | None) -> Path:
    """The trial's workdir. A rerun's is the original trial's, so it resumes from its
    checkpoints, when this worker reaches it (the same machine, or a shared filesystem);
    otherwise this worker's `trials/NNNN` for the original's number, started afresh."""
    own = self.workdir / "trials" / f"{trial.number if original is None else original:04d}"
    if original is None:
      return own
    attrs = trial.study.get_trials(deepcopy=False)[original].user_attrs
    if attrs.get("workdir") and Path(attrs["workdir"]).is_dir():
      return Path(attrs["workdir"])
    log.warning("trial %d: the workdir of trial %d (%s on %s) is not on this machine; it "
                "starts over in %s", trial.number, original, attrs.get("workdir"),
                attrs.get("host"), own)
    return own

  def _report(self, trial, trial_dir: Path, reported: set[int]) -> int | None:
    """Reports new validation results; returns the step if the pruner stops the trial."""
    key = self.spec.intermediate_metric
    for record in read_metrics(trial_dir / METRICS_FILE):
      step = record["step"]
      if key in record and step not in reported:
        reported.add(step)
        trial.report(record[key], step)
        if trial.should_prune():
          return step
    return None

  def _interrupted(self, trial, seconds: float):
    """Ctrl-C / SIGTERM: fail the trial and queue its rerun (it resumes from its checkpoint)."""
    trial.set_user_attr("wall_time_s", round(seconds, 1))
    trial.set_user_attr("error", "worker interrupted")
    frozen = self.study.tell(trial, state=TrialState.FAIL)
    callback = self.storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
      callback(self.study, frozen)
    log.warning("trial %d interrupted: marked failed and queued to rerun", trial.number)


def _retry_history(trial) -> list[int]:
  """The numbers of the trials this one reruns, the first the original."""
  return optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(
      trial.study.get_trials(deepcopy=False)[trial.number])


def objective_value(records: list[dict], spec: sweep_spec.SweepSpec) -> float | None:
  values = [r[spec.objective] for r in records if spec.objective in r]
  if not values:
    return None
  if spec.reduce == "last":
    return values[-1]
  return max(values) if spec.direction == "maximize" else min(values)


@contextlib.contextmanager
def _no_more_signals():
  """SIGTERM and SIGINT ignored while an interrupted trial is stopped and recorded (a shell's
  `timeout`, Slurm and Ctrl-C signal the whole process group, often twice); restored after."""
  previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


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

