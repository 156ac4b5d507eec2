"""The clocks and guards the training loop consults: a non-finite update under 'stop', the time
budget's clock, and the wall-clock intervals of validation and checkpoints (agreed across
hosts). What the loop does with their answers is `schedule`'s decision."""

from __future__ import annotations

import dataclasses
import logging
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax.errors import NonFiniteError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class NonFiniteGuard:
  """Acts on the non-finite steps counted in the metrics (their updates were not applied):
  'stop' raises naming the first such step, 'skip' logs them and goes on."""
  policy: str

  def check(self, acc, step: int, ckpt):
    """Under 'stop', raises if `acc` (metric sums up to `step`) counts a non-finite step."""
    if self.policy != "stop" or not acc["nonfinite_steps"]:
      return
    ckpt.wait()  # (the save in flight, if any, completes: the message names what is on disk)
    latest = ckpt.latest_step()
    raise NonFiniteError(
        f"non-finite loss or gradient at step {int(acc['first_nonfinite_step'])}; its update "
        f"was not applied. Stopped at step {step}; the last checkpoint "
        f"({f'step {latest}' if latest else 'none'} in {ckpt.directory}) is intact. Lower the "
        "learning rate, or set config.nonfinite_updates='skip' to skip such steps")

  def report(self, acc) -> int:
    """Logs the skipped steps counted in `acc`; returns their number."""
    count = int(acc["nonfinite_steps"])
    if count:
      log.warning("skipped %d update(s) with a non-finite loss or gradient (first at step %d)",
                  count, int(acc["first_nonfinite_step"]))
    return count


class TimeBudget:
  """The wall clock of the training loop against config.time_budget_minutes (0: no limit),
  counted from this object's creation on top of the `prior_minutes` of earlier runs."""

  def __init__(self, budget_minutes: float, prior_minutes: float):
    self.budget, self.prior, self.t0 = budget_minutes, prior_minutes, time.time()

  def minutes(self) -> float:
    """Training-loop minutes so far, earlier runs of the workdir included."""
    return self.prior + (time.time() - self.t0) / 60

  def spent(self) -> bool:
    return self.budget > 0 and self.minutes() >= self.budget

  def seconds_left(self) -> float | None:
    return max(self.budget - self.minutes(), 0.0) * 60 if self.budget > 0 else None


class WallClockIntervals:
  """Which of (validation, checkpoint) is due by wall clock (config.eval_every_minutes,
  config.checkpoint_every_minutes; 0 = never), asked at logging steps. With several processes
  process 0's clock decides for all, so that every host validates and saves at the same step."""

  def __init__(self, eval_minutes: float, checkpoint_minutes: float, clock=time.time):
    self.minutes = (eval_minutes, checkpoint_minutes)
    self.clock = clock
    self.last = [clock(), clock()]

  @property
  def active(self) -> bool:
    return any(m > 0 for m in self.minutes)

  def due(self) -> tuple[bool, bool]:
    now = self.clock()
    due = np.array([m > 0 and now - last >= m * 60 for m, last in zip(self.minutes, self.last)])
    if jax.process_count() > 1:
      due = multihost_utils.broadcast_one_to_all(due)
    return bool(due[0]), bool(due[1])

  def done(self, which: int):
    """Validation (0) or a checkpoint (1) has just happened, whatever made it due."""
    self.last[which] = self.clock()
