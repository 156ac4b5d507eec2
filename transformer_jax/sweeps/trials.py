"""One trial of a sweep: an ordinary training run (`transformer_jax.cli.train` in a subprocess)
with the trial's config overrides, its validation metrics reported to Optuna's pruner as they
appear, and its outcome (complete, pruned, failed) told to the study."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.reporting.metrics import METRICS_FILE, read_metrics

log = logging.getLogger(__name__)

TRAIN = [sys.executable, "-m", "transformer_jax.cli.train"]  # a trial's command, before its flags


def _die_with_parent():
  """Linux: the trial gets SIGTERM if its worker dies (no orphan training in the workdir)."""
  with contextlib.suppress(Exception):
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


RETRY_WAIT_S = 3600  # the longest a trial waits for an orphaned run in its workdir


class TrialRunner:
  """Runs trials as training subprocesses, reporting validation metrics for pruning (read
  every `poll_s` seconds: a pruned trial is stopped within that time of its report)."""

  def __init__(self, study, storage, spec: sweep_spec.SweepSpec, base_args: list[str],
               override_of, workdir: Path, devices: str, heartbeat_interval: float,
               poll_s: float = 0.25):
    self.study, self.storage, self.spec = study, storage, spec
    self.base_args, self.override_of = base_args, override_of
    self.workdir, self.devices = workdir, devices
    self.heartbeat_interval, self.poll_s = heartbeat_interval, poll_s

  def command(self, params: dict, trial_dir: Path | str) -> list[str]:
    """The trial's full command line: the base config, its overrides, the spec's fixed
    values, the trial's values, and the trial's workdir."""
    args = [self.override_of(k, v) for k, v in {**self.spec.fixed, **params}.items()]
    return [*TRAIN, *self.base_args, *args, f"--workdir={trial_dir}"]

  def env(self) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if self.devices:
      env["CUDA_VISIBLE_DEVICES"] = self.devices  # NVIDIA
      env["HIP_VISIBLE_DEVICES"] = self.devices   # AMD
    return env

  def run(self, trial, trial_id: int) -> None:
    """Runs one claimed trial to the end and tells Optuna how it went."""
    history = optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(
        trial.study.get_trials(deepcopy=False)[trial.number])
    trial_dir = self._trial_dir(trial, history[0] if history else None)
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
      # (a retried trial waits for its workdir while a dead worker's orphaned run finishes:
      # never two writers in one trial workdir)
      proc = subprocess.Popen([*cmd, f"--wait_for_workdir={RETRY_WAIT_S}"], stdout=out,
                              stderr=subprocess.STDOUT, env=self.env(),
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
      with _no_more_signals():  # (a second SIGTERM/Ctrl-C must not skip the bookkeeping)
        _stop(proc)
        self._interrupted(trial, time.time() - start)
      raise

    seconds = time.time() - start
    records = read_metrics(trial_dir / METRICS_FILE)
    steps = max((r["step"] for r in records), default=0)
    trial.set_user_attr("wall_time_s", round(seconds, 1))
    trial.set_user_attr("steps", steps)
    if pruned_at is not None:
      self.study.tell(trial, state=TrialState.PRUNED)
      log.info("trial %d pruned at step %d (%.0fs)", trial.number, pruned_at, seconds)
      return
    value = objective_value(records, self.spec)
    if proc.returncode != 0 or value is None:
      reason = (f"training exited with status {proc.returncode}" if proc.returncode
                else f"the run logged no {self.spec.objective}")
      trial.set_user_attr("error", f"{reason}: {_tail(trial_dir / 'train.log')}")
      self.study.tell(trial, state=TrialState.FAIL)
      log.warning("trial %d failed (%s); see %s", trial.number, reason,
                  trial_dir / "train.log")
      return
    self.study.tell(trial, value)
    log.info("trial %d: %s=%.4f after %d steps (%.0fs)", trial.number, self.spec.objective,
             value, steps, seconds)

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

