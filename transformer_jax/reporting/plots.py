"""Plots: one matplotlib set-up (headless, each figure written atomically), and the curves of a
run (loss and BLEU by step) and of a checkpoint evaluation (BLEU by checkpoint)."""

from __future__ import annotations

from pathlib import Path

import jax

from transformer_jax import atomic
from transformer_jax.reporting.metrics import METRICS_FILE, read_metrics


def pyplot():
  """matplotlib.pyplot on the headless Agg back end (imported when a plot is first drawn:
  importing it costs a third of a second that runs without plots need not pay)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save(fig, path: Path, dpi: int = 100):
  """Writes `fig` to `path` (readers never see a half-written file) and closes it."""
  fig.tight_layout()
  with atomic.replacing(path) as tmp:
    fig.savefig(tmp, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
  pyplot().close(fig)


def plot_metrics(workdir: str | Path) -> Path | None:
  """Draws training/eval loss and BLEU against step into <workdir>/metrics.png (a dashed line
  where a time budget ended training)."""
  records = read_metrics(Path(workdir) / METRICS_FILE)
  if not records or jax.process_index() != 0:
    return None
  plt = pyplot()

  def series(key):
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]

  fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
  # Both curves are plain NLL (train/loss is label-smoothed, so not comparable to eval/loss).
  for key, label in (("train/nll", "train NLL"), ("eval/loss", "validation NLL")):
    xs, ys = series(key)
    if xs:
      ax_loss.plot(xs, ys, label=label, marker="." if key.startswith("eval") else None)
  for step in series("train/time_budget_stop")[0]:  # where a time budget ended training
    for ax in (ax_loss, ax_bleu):
      ax.axvline(step, color="grey", linestyle="--", label="time budget stop")
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
  out = Path(workdir) / "metrics.png"
  save(fig, out)
  return out


def plot_bleu_by_step(steps: list[int], bleu: list[float], chrf: list[float], path: Path):
  """BLEU and chrF of a run's checkpoints against their steps."""
  fig, ax = pyplot().subplots(figsize=(6, 4))
  ax.plot(steps, bleu, marker="o", label="BLEU")
  ax.plot(steps, chrf, marker=".", label="chrF")
  ax.set_xlabel("step")
  ax.set_ylabel("score")
  ax.grid(alpha=0.3)
  ax.legend()
  save(fig, path)
