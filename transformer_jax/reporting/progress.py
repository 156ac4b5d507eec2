"""The progress of a long run: step, loss, tokens/s, elapsed time and ETA."""

from __future__ import annotations

import logging
import sys
import time

import jax
from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
  """Live progress: a tqdm bar (step, loss, tokens/s, ETA) on a terminal, and a log line
  every `log_every_steps` elsewhere (CI logs, nohup). With `seconds_left` (a time budget), the
  ETA is the budget's end when that comes first."""

  def __init__(self, total_steps: int, start_step: int, seconds_left: float | None = None):
    self.total, self.start, self.seconds_left = total_steps, start_step, seconds_left
    self.t0 = time.time()
    self.bar = None
    if sys.stderr.isatty() and jax.process_index() == 0:
      self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
      self._shown = start_step

  def update(self, step: int, metrics: dict[str, float]):
    if self.bar is not None:
      self.bar.update(step - self._shown)
      self._shown = step
      postfix = {}
      if "train/loss" in metrics:
        postfix["loss"] = f"{metrics['train/loss']:.3f}"
      if "perf/tokens_per_sec" in metrics:
        postfix["tok/s"] = f"{metrics['perf/tokens_per_sec']:,.0f}"
      self.bar.set_postfix(postfix)
      return
    if jax.process_index() != 0:
      return
    done = step - self.start
    elapsed = time.time() - self.t0
    eta, until = elapsed / max(done, 1) * (self.total - step), ""
    if self.seconds_left is not None and self.seconds_left - elapsed < eta:
      eta, until = max(self.seconds_left - elapsed, 0.0), " (end of the time budget)"
    parts = [f"step {step}/{self.total}", f"{100 * step / self.total:5.1f}%"]
    if "train/loss" in metrics:
      parts.append(f"loss {metrics['train/loss']:.3f}")
    if "perf/tokens_per_sec" in metrics:
      parts.append(f"{metrics['perf/tokens_per_sec']:,.0f} tok/s")
    parts += [f"elapsed {hms(elapsed)}", f"ETA {hms(eta)}{until}"]
    log.info("%s", " | ".join(parts))

  def close(self):
    if self.bar is not None:
      self.bar.close()


def hms(seconds: float) -> str:
  """Seconds as H:MM:SS."""
  seconds = int(seconds)
  return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
