"""Sweep results from the Optuna study: a table (printed, CSV, JSON), plots, and the best
trial's command line, written into the sweep's workdir."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
from pathlib import Path

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.errors import Error
from transformer_jax.evaluation import significance
from transformer_jax.reporting import plots
from transformer_jax.workdir import layout

STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
          "WAITING": "waiting"}


def rows(study, spec: sweep_spec.SweepSpec) -> list[dict]:
  """One row per started trial, in trial order. A pruned trial's objective is its last
  reported validation value (at `steps`); a failed or running trial has none (its curve is
  in `intermediate`). A failed trial always says why: its error, or that its worker stopped
  (no heartbeat) and which trial reruns it."""
  trials = [t for t in study.get_trials(deepcopy=False) if STATES[t.state.name] != "waiting"]
  reruns = {t.user_attrs["retry_of"]: t.number for t in trials
            if t.user_attrs.get("retry_of") is not None}
  out = []
  for t in trials:
    state = STATES[t.state.name]
    value = t.value
    if state == "pruned" and value is None and t.intermediate_values:
      value = t.intermediate_values[max(t.intermediate_values)]
    error = t.user_attrs.get("error")
    if state == "failed" and not error:
      error = ("its worker stopped (no heartbeat: killed or lost)"
               + (f"; rerun as trial {reruns[t.number]}" if t.number in reruns else ""))
    out.append({"trial": t.number, "state": state, "objective": value,
                "steps": t.user_attrs.get("steps"),
                "wall_time_s": t.user_attrs.get("wall_time_s"),
                **{name: t.params.get(name) for name in spec.search_space},
                "retry_of": t.user_attrs.get("retry_of"), "host": t.user_attrs.get("host"),
                "workdir": t.user_attrs.get("workdir"), "error": error,
                "intermediate": {int(k): v for k, v in sorted(t.intermediate_values.items())}})
  return out


def ranked(table: list[dict], spec: sweep_spec.SweepSpec) -> list[dict]:
  """Finished trials best first, then pruned (best first), running and failed."""
  sign = -1.0 if spec.direction == "maximize" else 1.0
  order = {"complete": 0, "pruned": 1, "running": 2, "failed": 3}

  def key(row):
    value = row["objective"]
    return (order[row["state"]], sign * value if value is not None else math.inf, row["trial"])
  return sorted(table, key=key)


def best(table: list[dict], spec: sweep_spec.SweepSpec) -> dict | None:
  done = [r for r in ranked(table, spec) if r["state"] == "complete"]
  return done[0] if done else None


# The metric of a translation objective, as significance.metrics() names it.
TESTED = {"bleu": "BLEU", "chrf": "chrF2"}


def p_vs_best(table: list[dict], spec: sweep_spec.SweepSpec) -> dict[int, float]:
  """For each complete trial but the best, the paired bootstrap p-value (sacreBLEU's, its
  seed) of its objective's difference from the best trial's, on the translations that scored
  them: the main validation set's (the last validation's; for `reduce="best"`, the best
  BLEU's, so a chrF objective reduced by its best is tested where that is the same
  validation) or the test set's. Trials whose translations are gone, or whose references
  differ from the best's, have none; {} for a loss objective. Each pair is computed once
  per process (kept while neither file changes)."""
  metric = spec.objective.split("/", 1)[1]
  top = best(table, spec)
  if metric not in TESTED or top is None:
    return {}
  found = {row["trial"]: _translations(row, spec) for row in table
           if row["state"] == "complete"}
  base = found.get(top["trial"])
  if base is None:
    return {}
  out = {}
  for trial, files in found.items():
    if files is None or trial == top["trial"]:
      continue
    try:
      key = (metric, *base, *files, *(p.stat().st_mtime_ns for p in (*base, *files)))
    except OSError:
      continue
    if key not in _TESTED_PAIRS:
      _TESTED_PAIRS[key] = _p_value(base, files, TESTED[metric])
    if _TESTED_PAIRS[key] is not None:
      out[trial] = _TESTED_PAIRS[key]
  return out


_TESTED_PAIRS: dict[tuple, float | None] = {}


def _p_value(base: tuple[Path, Path], files: tuple[Path, Path], metric: str) -> float | None:
  """The system's p-value against the baseline, each (hypotheses, references) files; None
  when their references differ or a file cannot be read or does not fit."""
  try:
    references = layout.read_lines(base[1])
    if layout.read_lines(files[1]) != references:
      return None
    results = significance.paired_bootstrap([layout.read_lines(base[0])],
                                            [layout.read_lines(files[0])], references,
                                            only=metric)
  except (OSError, UnicodeError, Error):  # (a file gone or cut short)
    return None
  return results[metric][1].p_value


def _translations(row: dict, spec: sweep_spec.SweepSpec) -> tuple[Path, Path] | None:
  """(hypotheses file, references file) whose score is the trial's objective, or None."""
  if not row["workdir"]:
    return None
  split, metric = spec.objective.split("/", 1)
  workdir = Path(row["workdir"])
  if split == "eval":
    folder = workdir / layout.VALIDATION
    name = "last" if spec.reduce == "last" else "best"
    candidates = [(folder, name, folder / f"{name}.json")]
  else:
    candidates = [(folder, None, folder / "results.json")
                  for folder in sorted((workdir / "eval").glob("*")) if folder.is_dir()]
  for folder, name, record_file in candidates:
    try:
      record = json.loads(record_file.read_text())
      if name is None:  # (results.json: the last evaluation's record)
        record = record[-1]
        name = record["label"]
      files = (folder / f"{name}.hyp", folder / "references.txt")
      if (math.isclose(record[metric], row["objective"], rel_tol=1e-9, abs_tol=1e-9)
          and all(f.is_file() for f in files)):
        return files
    except (OSError, ValueError, KeyError, IndexError, TypeError):
      continue
  return None


def format_table(table: list[dict], spec: sweep_spec.SweepSpec) -> str:
  names = list(spec.search_space)
  tested = any(row.get("p_vs_best") is not None for row in table)
  top = best(table, spec)
  header = ["trial", "state", spec.objective, "steps", "time"] + ["p vs best"] * tested + names
  lines = []
  for row in ranked(table, spec):
    value, p = row["objective"], row.get("p_vs_best")
    mark = ("best" if row is top else "" if p is None
            else f"{p:.3f}" + (" ~" if p >= 0.05 else ""))
    lines.append([str(row["trial"]), row["state"],
                  "" if value is None else f"{value:.4f}",
                  "" if row["steps"] is None else str(row["steps"]),
                  "" if row["wall_time_s"] is None else f"{row['wall_time_s']:.0f}s"]
                 + [mark] * tested + [_short(row[n]) for n in names])
  widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
            for i, h in enumerate(header)]
  fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
  counts = {s: sum(r["state"] == s for r in table) for s in ("complete", "pruned", "failed",
                                                             "running")}
  summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
  note = []
  if tested:
    same = [str(r["trial"]) for r in ranked(table, spec)
            if r.get("p_vs_best") is not None and r["p_vs_best"] >= 0.05]
    note = [f"p vs best: paired bootstrap of {spec.objective} against trial {top['trial']}'s "
            "on the same sentences (sacreBLEU's, 1000 resamples); ~ p >= 0.05, not "
            "significantly different from the best: "
            + (", ".join(same) if same else "none")]
  return "\n".join([f"{len(table)} trials ({summary}); {spec.objective}: {spec.direction}",
                    fmt(header)] + [fmt(line) for line in lines] + note)


def _short(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)


def write(study, spec: sweep_spec.SweepSpec, workdir: Path, command_of) -> str:
  """Writes results.csv/.json, the plots and best_command.sh; returns the printed table."""
  workdir = Path(workdir)
  table = rows(study, spec)
  tested = p_vs_best(table, spec)
  for row in table:
    row["p_vs_best"] = tested.get(row["trial"])
  names = list(spec.search_space)
  top = best(table, spec)

  buf = io.StringIO()
  fields = ["trial", "state", "objective", "p_vs_best", "steps", "wall_time_s", *names,
            "retry_of", "host", "workdir", "error"]
  writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
  writer.writeheader()
  writer.writerows(table)
  _atomic_write(workdir / "results.csv", buf.getvalue())

  summary = {"study": study.study_name, "objective": spec.objective,
             "direction": spec.direction, "reduce": spec.reduce, "sampler": spec.sampler,
             "search_space": spec.to_json()["search_space"], "trials": table, "best": None}
  if top is not None:
    params = {n: top[n] for n in names}
    argv = command_of(params, workdir / "best_rerun")
    summary["best"] = {"trial": top["trial"], "objective": top["objective"],
                       "params": params, "command": argv}
    _atomic_write(workdir / "best_command.sh", (
        "#!/bin/sh\n"
        f"# Best trial {top['trial']} of study {study.study_name!r}: {spec.objective} = "
        f"{top['objective']:.4f} ({spec.direction}, {spec.reduce} evaluation) after "
        f"{top['steps']} steps.\n"
        f"# Its run: {top['workdir']}\n"
        "# Reruns it from scratch in a new workdir (same seed: same result):\n"
        f"cd {shlex.quote(os.getcwd())}\n{shlex.join(argv)}\n"))
  _atomic_write(workdir / "results.json", json.dumps(summary, indent=2))
  if table:
    _plot_params(table, spec, workdir / "objective_vs_params.png")
    _plot_trials(table, spec, workdir / "objective_by_trial.png")
  return format_table(table, spec)


def _atomic_write(path: Path, text: str):
  """Several workers may rewrite the report at once: readers see a whole old or new file."""
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(text)
  os.replace(tmp, path)


def _plot_params(table, spec, path: Path):
  """The objective against each swept hyperparameter (pruned trials at their last value)."""
  plt = plots.pyplot()
  names = list(spec.search_space)
  cols = min(len(names), 3)
  nrows = math.ceil(len(names) / cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.6 * nrows), squeeze=False)
  top = best(table, spec)
  for ax, name in zip(axes.flat, names):
    dist = spec.search_space[name]
    values = [r[name] for r in table if r[name] is not None]
    if isinstance(dist, sweep_spec.Choice):  # (a choice, numbers too: one slot per value)
      labels = [_short(v) for v in dist.values]
      position = lambda v: labels.index(_short(v))  # noqa: E731
      ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0,
                    ha="right" if len(labels) > 4 else "center", fontsize=8)
      ax.set_xlim(-0.5, len(labels) - 0.5)
    else:
      position = lambda v: v  # noqa: E731
      if _log_axis(dist, values):
        ax.set_xscale("log")
      elif isinstance(dist, sweep_spec.Integer):
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    for state, marker, alpha in (("complete", "o", 0.9), ("pruned", "x", 0.6)):
      pts = [(position(r[name]), r["objective"]) for r in table
             if r["state"] == state and r["objective"] is not None and r[name] is not None]
      if pts:
        ax.scatter(*zip(*pts), marker=marker, alpha=alpha, label=state)
    if top is not None and top[name] is not None:
      ax.scatter([position(top[name])], [top["objective"]], marker="*", s=200,
                 color="gold", edgecolor="black", zorder=3, label="best")
    ax.set_xlabel(name)
    ax.set_ylabel(spec.objective)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(names):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=8)
  plots.save(fig, path)


def _log_axis(dist, values) -> bool:
  if getattr(dist, "log", False):
    return True
  positive = [v for v in values if v > 0]
  return len(positive) == len(values) and bool(values) and max(values) / min(values) >= 10


def _plot_trials(table, spec, path: Path):
  """Left: the objective of each trial and the best so far. Right: every trial's validation
  curve (the values reported for pruning); pruned trials dashed."""
  plt = plots.pyplot()
  fig, (ax, curves) = plt.subplots(1, 2, figsize=(11, 4))
  better = max if spec.direction == "maximize" else min
  done = [r for r in table if r["state"] == "complete"]
  pruned = [r for r in table if r["state"] == "pruned" and r["objective"] is not None]
  if done:
    ax.scatter([r["trial"] for r in done], [r["objective"] for r in done], label="complete")
    best_so_far, xs, ys = None, [], []
    for r in sorted(done, key=lambda r: r["trial"]):
      best_so_far = r["objective"] if best_so_far is None else better(best_so_far,
                                                                       r["objective"])
      xs.append(r["trial"])
      ys.append(best_so_far)
    ax.step(xs, ys, where="post", color="black", alpha=0.6, label="best so far")
  if pruned:
    ax.scatter([r["trial"] for r in pruned], [r["objective"] for r in pruned], marker="x",
               label="pruned (last value)")
  ax.set_xlabel("trial")
  ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))  # (trials are whole numbers)
  ax.set_ylabel(spec.objective)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  for r in table:
    if r["intermediate"]:
      steps = sorted(r["intermediate"])
      curves.plot(steps, [r["intermediate"][s] for s in steps], marker=".",
                  linestyle="--" if r["state"] == "pruned" else "-", label=f"trial {r['trial']}")
  curves.set_xlabel("training step")
  curves.set_ylabel(spec.intermediate_metric)
  curves.grid(alpha=0.3)
  if len(table) <= 12:
    curves.legend(fontsize=7)
  plots.save(fig, path)
