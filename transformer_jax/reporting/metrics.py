"""Run metrics as files a person can plot: `metrics.jsonl` (one JSON record per line, with its
step) and TensorBoard events, written by process 0."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from transformer_jax import atomic
from transformer_jax.errors import DataError

METRICS_FILE = "metrics.jsonl"


class MetricWriter:
  """Appends `{"step": N, "train/loss": ...}` lines to metrics.jsonl and TensorBoard events.

  Only process 0 writes; the others accept calls and do nothing. A run that starts from step
  `resumed_at` hides the TensorBoard events of later steps that an earlier run wrote
  (TensorBoard's purge marker), as truncate_metrics drops their records.
  """

  def __init__(self, workdir: str | Path, resumed_at: int = 0):
    self.path = Path(workdir) / METRICS_FILE
    self.active = jax.process_index() == 0
    self._tb = None
    if self.active:
      from tensorboardX import SummaryWriter  # imported here: only the writing process needs it
      # (the file is named by the second it was opened in, then this suffix: the whole clock in
      # nanoseconds, so that a run resumed within the same second writes a new file, sorting
      # after; the second is read after the suffix, so a suffix of its fraction alone could
      # belong to the second before and sort an earlier writer's file after a later one's)
      self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resumed_at + 1,
                               filename_suffix=f".{time.time_ns():020d}")

  def write(self, step: int, metrics: dict[str, float]):
    if not self.active:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in metrics.items():
      self._tb.add_scalar(k, float(v), int(step))
    self._tb.flush()

  def write_text(self, step: int, tag: str, text: str):
    if self.active:
      self._tb.add_text(tag, text, int(step))

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_metrics(path: str | Path) -> list[dict]:
  path = Path(path)
  if not path.is_file():
    return []
  records = []
  lines = path.read_text().splitlines()
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      if number < len(lines):  # (the last line may be being written right now)
        raise DataError(f"{path}:{number}: not a JSON record: {e}") from None
  return records


def truncate_metrics(path: str | Path, last_step: int) -> list[dict]:
  """The records of `path` up to `last_step`, and (process 0) the file cut to them, atomically:
  a run resumed from the checkpoint of `last_step` redoes the steps after it, and each step
  is then recorded once (plots and early stopping see one history)."""
  records = read_metrics(path)
  kept = [r for r in records if r["step"] <= last_step]
  if len(kept) < len(records) and jax.process_index() == 0:
    atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
  return kept


def sum_metrics(acc, new):
  """Adds up metric sums over steps (`first_*` entries keep the smallest); an empty `acc`
  starts."""
  if not acc:
    return new
  return {k: (jnp.minimum if k.startswith("first_") else jnp.add)(acc[k], new[k]) for k in acc}
