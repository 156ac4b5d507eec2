"""Preemption handling and deterministic fault injection for the training loop.

`Preemption` notices SIGTERM, what schedulers (SLURM, Kubernetes) and TPU/GPU preemption
send: in one process through our own signal handler, across processes through JAX's
preemption service (`jax.distributed`), with which all hosts agree on the step to stop at.

`Faults` injects failures at exact steps, for the reliability tests and for rehearsing a
cluster's preemption handling. Set TRANSFORMER_JAX_FAULTS to comma-separated `kind@step`:
  sigkill@N    the process kills itself with SIGKILL right after step N (no chance to save)
  sigterm@N    the process sends itself SIGTERM right after step N (preemption)
  sigterm_validating@N  SIGTERM as the validation of step N starts (a preemption mid-evaluation)
  nonfinite@N  step N's gradients are NaN (the update is never applied)
  sigkill_saving@N  SIGKILL right after the save of step N started (its files half written)
  enospc_saving@N   the save of step N fails as on a full disk (OSError ENOSPC)
  slow_validation@N the validation of step N waits SLOW_BATCH_S before each batch (a long
                    evaluation, without the CPU time of one)
  fast_clock@N      this process's training clock runs N times fast (a host whose clock
                    disagrees: the time budget must not follow it; N is a factor, not a step)
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import time

import jax

log = logging.getLogger(__name__)

ENV = "TRANSFORMER_JAX_FAULTS"
SLOW_BATCH_S = 0.5
_CLOCK_START = time.time()  # (fast_clock@N counts from here)


@dataclasses.dataclass(frozen=True)
class Faults:
  sigkill_at: int = 0
  sigterm_at: int = 0
  sigterm_validating_at: int = 0
  nonfinite_at: int = 0
  sigkill_saving_at: int = 0
  enospc_saving_at: int = 0
  slow_validation_at: int = 0
  fast_clock_at: int = 0  # (fast_clock@N: a factor)

  @classmethod
  def from_env(cls) -> "Faults":
    spec = os.environ.get(ENV, "").strip()
    values = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
      kind, _, step = item.partition("@")
      field = f"{kind}_at"
      if field not in {f.name for f in dataclasses.fields(cls)} or not step.isdigit():
        raise ValueError(f"{ENV}={spec!r}: {item!r} is not one of sigkill@N, sigterm@N, "
                         "sigterm_validating@N, nonfinite@N, sigkill_saving@N, "
                         "enospc_saving@N, slow_validation@N, fast_clock@N")
      values[field] = int(step)
    if values:
      log.warning("fault injection (%s=%s): %s", ENV, spec, values)
    return cls(**values)

  def clock(self) -> float:
    """The training clock in seconds: time.time(), or under fast_clock@N N times fast."""
    now = time.time()
    if not self.fast_clock_at:
      return now
    return _CLOCK_START + (now - _CLOCK_START) * self.fast_clock_at

  def before_save(self, step: int, directory):
    """A full disk at the save of `step`."""
    if step == self.enospc_saving_at:
      log.warning("fault injection: no space left for the save of step %d", step)
      raise OSError(errno.ENOSPC, "No space left on device", str(directory / str(step)))

  def after_save(self, step: int):
    """SIGKILL while the checkpoint of `step` is being written in the background."""
    if step == self.sigkill_saving_at:
      log.warning("fault injection: SIGKILL during the save of step %d", step)
      os.kill(os.getpid(), signal.SIGKILL)

  def before_validation(self, step: int):
    if step == self.sigterm_validating_at:
      log.warning("fault injection: SIGTERM as the validation of step %d starts", step)
      os.kill(os.getpid(), signal.SIGTERM)

  def before_validation_batch(self, step: int):
    """A slow validation batch of step `step`."""
    if step == self.slow_validation_at:
      time.sleep(SLOW_BATCH_S)

  def after_step(self, step: int):
    if step == self.sigkill_at:
      log.warning("fault injection: SIGKILL after step %d", step)
      os.kill(os.getpid(), signal.SIGKILL)
    if step == self.sigterm_at:
      log.warning("fault injection: SIGTERM after step %d", step)
      os.kill(os.getpid(), signal.SIGTERM)


class Preemption:
  """`requested(step)` is True once SIGTERM has arrived (on any host, for the same step on
  all hosts): the loop then saves a checkpoint at that step and exits."""

  def __init__(self, checkpoint_manager):
    self._manager = checkpoint_manager
    self._multi_process = jax.process_count() > 1
    self._signalled = False
    self._previous = None
    if not self._multi_process:  # (JAX's preemption service owns SIGTERM across processes)
      try:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      except ValueError:  # not the main thread: leave SIGTERM's default action
        log.warning("training outside the main thread: SIGTERM will not save a checkpoint")

  def _on_sigterm(self, signum, frame):
    del signum, frame
    if not self._signalled:
      log.warning("SIGTERM: saving a checkpoint after the current step, then exiting")
    self._signalled = True

  def signalled_here(self) -> bool:
    """SIGTERM has arrived in this single-process run: what cuts a validation short. (Across
    processes the preemption service agrees on steps only, so there a validation in
    progress runs to its end before the save.)"""
    return not self._multi_process and self._signalled

  def requested(self, step: int) -> bool:
    if self._multi_process:
      return self._manager.reached_preemption(step)
    return self._signalled

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
