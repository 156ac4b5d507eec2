"""Run metrics: JSONL and TensorBoard writers, a progress line, and plots of the curves."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import logging

log = logging.getLogger(__name__)


class MetricWriter:
  """Appends `{"step": N, "train/loss": ...}` lines to metrics.jsonl and TensorBoard events.

  Only process 0 writes; the others accept calls and do nothing.
  """

  def __init__(self, workdir: str | Path):
    self.path = Path(workdir) / "metrics.jsonl"
    self.active = jax.process_index() == 0
    self._tb = None
    if self.active:
      from tensorboardX import SummaryWriter  # imported here: only the writing process needs it
      self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"))

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
        raise ValueError(f"{path}:{number}: not a JSON record: {e}") from None
  return records


class Progress:
  """Live progress: a tqdm bar (step, loss, tokens/s, ETA) on a terminal, and a log line
  every `log_every_steps` elsewhere (CI logs, nohup)."""

  def __init__(self, total_steps: int, start_step: int):
    self.total, self.start = total_steps, start_step
    self.t0 = time.time()
    self.bar = None
    if sys.stderr.isatty() and jax.process_index() == 0:
      from tqdm import tqdm
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
    eta = elapsed / max(done, 1) * (self.total - step)
    parts = [f"step {step}/{self.total}", f"{100 * step / self.total:5.1f}%"]
    if "train/loss" in metrics:
      parts.append(f"loss {metrics['train/loss']:.3f}")
    if "perf/tokens_per_sec" in metrics:
      parts.append(f"{metrics['perf/tokens_per_sec']:,.0f} tok/s")
    parts += [f"elapsed {_hms(elapsed)}", f"ETA {_hms(eta)}"]
    log.info("%s", " | ".join(parts))

  def close(self):
    if self.bar is not None:
      self.bar.close()


def _hms(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def plot_metrics(workdir: str | Path) -> Path | None:
  """Draws training/eval loss and BLEU against step into <workdir>/metrics.png."""
  records = read_metrics(Path(workdir) / "metrics.jsonl")
  if not records or jax.process_index() != 0:
    return None
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  def series(key):
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]

  fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
  # Both curves are plain NLL (train/loss is label-smoothed, so not comparable to eval/loss).
  for key, label in (("train/nll", "train NLL"), ("eval/loss", "validation NLL")):
    xs, ys = series(key)
    if xs:
      ax_loss.plot(xs, ys, label=label, marker="." if key.startswith("eval") else None)
  ax_loss.set_xlabel("step")
  ax_loss.set_ylabel("negative log-likelihood (nats/token)")
  ax_loss.legend()
  ax_loss.grid(alpha=0.3)
  for key in ("eval/bleu", "test/bleu"):
    xs, ys = series(key)
    if xs:
      ax_bleu.plot(xs, ys, label=key, marker="o")
  ax_bleu.set_xlabel("step")
  ax_bleu.set_ylabel("sacreBLEU")
  ax_bleu.legend()
  ax_bleu.grid(alpha=0.3)
  fig.tight_layout()
  out = Path(workdir) / "metrics.png"
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


def log_to_stderr():
  """Our own progress lines ("HH:MM:SS message") at INFO on stderr, apart from absl's log."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
  ours = logging.getLogger("transformer_jax")
  ours.setLevel(logging.INFO)
  ours.addHandler(handler)
  ours.propagate = False


def quiet_libraries():
  """Library chatter (Orbax, TFDS) only from WARNING up, unless --verbosity asked for more."""
  from absl import flags, logging as absl_logging
  if flags.FLAGS.is_parsed() and flags.FLAGS.verbosity <= 0:
    absl_logging.set_verbosity(absl_logging.WARNING)
