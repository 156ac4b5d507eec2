"""The clocks and guards the training loop consults: a non-finite update under 'stop', the time
budget's clock, and the wall-clock intervals of validation and checkpoints (agreed across
hosts). What the loop does with their answers is `decisions`' decision."""

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
  counted from this object's creation on top of the `prior_minutes` of earlier runs.

  Every process must stop at the same step and scale its updates by the same cooldown factor,
  so with several processes the minutes are process 0's: at each logging step (`agree`, which
  every process calls at the same step) all take process 0's reading, broadcast, and between
  two logging steps each extrapolates it by the steps done at the last interval's minutes per
  step: the same numbers on every host, with no collective per step (the budget can therefore
  end no earlier than the first logging step). One process reads its own clock at every step.
  `clock`: seconds (time.time; fault injection runs it fast); `shared`/`broadcast`: several
  processes and process 0's value (default: jax's process count and a broadcast)."""

  def __init__(self, budget_minutes: float, prior_minutes: float, start_step: int = 0,
               clock=time.time, shared: bool | None = None, broadcast=None):
    self.budget, self.prior, self.clock, self.t0 = budget_minutes, prior_minutes, clock, clock()
    self.shared = jax.process_count() > 1 if shared is None else shared
    self.broadcast = broadcast or _from_process_0
    self.anchor = (start_step, prior_minutes)  # (step, minutes) agreed last
    self.rate = 0.0                            # minutes per step over the last interval

  def _local_minutes(self) -> float:
    return self.prior + (self.clock() - self.t0) / 60

  def agree(self, step: int):
    """At a logging step: every process takes process 0's minutes (one process: nothing)."""
    if not self.shared:
      return
    minutes = self.broadcast(self._local_minutes())
    last_step, last_minutes = self.anchor
    if step > last_step:
      self.rate = (minutes - last_minutes) / (step - last_step)
    self.anchor = (step, minutes)

  def minutes(self, step: int) -> float:
    """Training-loop minutes at `step`, earlier runs of the workdir included."""
    if not self.shared:
      return self._local_minutes()
    last_step, last_minutes = self.anchor
    return last_minutes + self.rate * (step - last_step)

  def spent(self, step: int) -> bool:
    return self.budget > 0 and self.minutes(step) >= self.budget

  def seconds_left(self, step: int) -> float | None:
    return max(self.budget - self.minutes(step), 0.0) * 60 if self.budget > 0 else None


def _from_process_0(value: float) -> float:
  return float(multihost_utils.broadcast_one_to_all(np.float32(value)))


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
