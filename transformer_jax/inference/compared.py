"""The systems `compare` tests: their translations of a test set, read from a hypothesis file,
from a run's workdir (what `evaluate` or training's test wrote in eval/<set>/), or from each
member of a population (<workdir>/members/<i>/eval/<set>/); and the set's references."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.data.plan import data_plan
from transformer_jax.errors import Error
from transformer_jax.evaluation import significance
from transformer_jax.workdir import layout
from transformer_jax.workdir.preparation import load_tokenizer


@dataclasses.dataclass(frozen=True)
class System:
  """A system's name and its members' translations (one list for a single run)."""
  name: str
  members: list[list[str]]
  files: list[Path]     # each member's translations
  workdirs: list[Path]  # the runs they come from ([] for files)


def system(spec: str, set_name: str, label: str) -> System:
  """The system `spec` names: a hypothesis file, several joined by commas (a population by
  hand), a run's workdir or a population's."""
  files = [Path(p) for p in spec.split(",")]
  if all(f.is_file() for f in files):
    return System(spec, [layout.read_lines(f) for f in files], files, [])
  path = Path(spec)
  if not path.is_dir():
    raise Error(f"{spec}: neither a hypothesis file nor a workdir")
  members = layout.members(path) or [path]
  files = [_hypotheses(m, set_name, label) for m in members]
  return System(spec, [layout.read_lines(f) for f in files], files, members)


def _hypotheses(workdir: Path, set_name: str, label: str) -> Path:
  """The .hyp file of `label` (default: the last one evaluated, which for a population's
  members may be of different steps: `tested` names the files) in the workdir's eval/<set>/
  (default: its only set)."""
  eval_root = workdir / "eval"
  sets = sorted(p.name for p in eval_root.iterdir() if p.is_dir()) if eval_root.is_dir() else []
  if not sets:
    raise Error(f"{workdir} has no translations in eval/: run transformer-jax-evaluate "
                f"--workdir={workdir} first")
  if not set_name:
    if len(sets) > 1:
      raise Error(f"{workdir}/eval has several sets ({', '.join(sets)}): name one with --set")
    set_name = sets[0]
  folder = eval_root / set_name
  if not folder.is_dir():
    raise Error(f"{workdir}/eval has no set {set_name!r} (it has {', '.join(sets)})")
  if not label:
    records = layout.read_results(folder)
    if not records:
      raise Error(f"{folder} has no results.json: name the translations with --label")
    label = records[-1]["label"]
  path = folder / f"{label}.hyp"
  if not path.is_file():
    labels = sorted(p.stem for p in folder.glob("*.hyp"))
    raise Error(f"{folder} has no translations {label!r} (it has {', '.join(labels)})")
  return path


def references(reference_file: str, systems: list[System], set_name: str) -> list[str]:
  """The references: `reference_file`, else set `set_name` of the first run's data."""
  if reference_file:
    return layout.read_lines(Path(reference_file))
  runs = [w for s in systems for w in s.workdirs]
  if not runs:
    raise Error("--reference is needed to compare hypothesis files")
  cfg = layout.load_config(runs[0])
  name = set_name or _only_set(runs[0])
  return load_eval_set(cfg.data, name,
                       load_tokenizer(cfg, runs[0], data_plan(cfg.data))).references


def _only_set(workdir: Path) -> str:
  return sorted(p.name for p in (workdir / "eval").iterdir() if p.is_dir())[0]


def tested(baseline: System, systems: list[System], refs: list[str], test: str, samples: int,
           seed: int) -> tuple[list[str], dict]:
  """Each system tested against the baseline ("bs" or "ar"; `samples` 0: sacreBLEU's
  number): the lines to print and the report as JSON-ready data."""
  run = significance.paired_bootstrap if test == "bs" else significance.paired_randomization
  samples = samples or significance.DEFAULT_SAMPLES[test]
  lines = [f"{'paired bootstrap resampling' if test == 'bs' else 'approximate randomization'}"
           f", {samples} {'resamples' if test == 'bs' else 'trials'}, seed {seed}, "
           f"{len(refs)} sentences; * p < 0.05"]
  for system in [baseline, *systems]:
    if system.workdirs:
      lines.append(f"{system.name}: " + ", ".join(str(f) for f in system.files))
  report = {"test": test, "samples": samples, "seed": seed, "sentences": len(refs),
            "systems": []}
  for i, system in enumerate(systems):
    results = run(baseline.members, system.members, refs, samples, seed)
    for shown, which in ([(baseline, 0)] if i == 0 else []) + [(system, 1)]:
      chosen = {metric: pair[which] for metric, pair in results.items()}
      lines.append(_row(("baseline: " if which == 0 else "") + shown.name, chosen))
      report["systems"].append(_record(shown, chosen))
  return lines, report


def _row(name: str, results: dict) -> str:
  cells = []
  for metric, r in results.items():
    cell = f"{metric} {r.score:.2f}"
    if r.mean is not None:
      cell += f" ({r.mean:.2f} ± {r.ci:.2f})"
    if len(r.members) > 1:
      cell += f" [{len(r.members)} members: {r.member_mean:.2f} ± {r.member_std:.2f}]"
    if r.p_value is not None:
      cell += f" p = {r.p_value:.4f}{'*' if r.p_value < 0.05 else ''}"
    cells.append(cell)
  return f"{name}: " + " | ".join(cells)


def _record(system: System, results: dict) -> dict:
  return {"name": system.name, "members": len(system.members),
          "files": [str(f) for f in system.files], **{
      metric: {"score": r.score, "mean": r.mean, "ci": r.ci, "p_value": r.p_value,
               "member_scores": list(r.members), "member_mean": r.member_mean,
               "member_std": r.member_std} for metric, r in results.items()}}
