"""The systems `compare` tests: their translations of a test set, read from a hypothesis file,
from a run's workdir (what `evaluate` or training's test wrote in eval/<set>/), or from each
member of a population (<workdir>/members/<i>/eval/<set>/); and the set's references."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.data.plan import data_plan
from transformer_jax.errors import Error
from transformer_jax.evaluation import significance
from transformer_jax.workdir import layout
from transformer_jax.workdir.preparation import load_tokenizer

# Decoding settings that leave the translations as they are: results that differ only in them
# compare alike (how many sentences go together, what is logged, the cache's layout, how many
# hypotheses are returned beside the best).
_SAME_TRANSLATIONS = ("batch_size", "num_samples_to_log", "beam_impl", "nbest")
_CHECKPOINT_FORMS = [(re.compile(r"average_last_(\d+)_to_\d+"), r"average_last_\1_to_N"),
                     (re.compile(r"(best_)?step_\d+"), r"\1step_N")]


@dataclasses.dataclass(frozen=True)
class System:
  """A system's name, its members' translations (one list for a single run) and, for runs,
  the results.json record of each member's translations."""
  name: str
  members: list[list[str]]
  files: list[Path]     # each member's translations
  workdirs: list[Path]  # the runs they come from ([] for files)
  records: list[dict] = dataclasses.field(default_factory=list)


def system(spec: str, set_name: str, label: str, like: dict | None = None) -> System:
  """The system `spec` names: a hypothesis file, several joined by commas (a population by
  hand), a run's workdir or a population's. A run's translations are those made as `like`
  says (`made_by`; default: as its first member's chosen ones were): of `label`, else the
  last evaluated so; none such is an error naming what there is."""
  files = [Path(p) for p in spec.split(",")]
  if all(f.is_file() for f in files):
    return System(spec, [layout.read_lines(f) for f in files], files, [])
  path = Path(spec)
  if not path.is_dir():
    raise Error(f"{spec}: neither a hypothesis file nor a workdir")
  members = layout.members(path) or [path]
  files, records = [], []
  for member in members:
    hyp, record = _hypotheses(member, set_name, label, like)
    like = like or made_by(record)
    files.append(hyp)
    records.append(record)
  return System(spec, [layout.read_lines(f) for f in files], files, members, records)


def systems(specs: list[str], set_name: str, label: str) -> list[System]:
  """The systems `specs` name (the baseline first), every run's translations made as the
  first run's chosen ones were (`system`)."""
  out, like = [], None
  for spec in specs:
    out.append(system(spec, set_name, label, like))
    if like is None and out[-1].records:
      like = made_by(out[-1].records[0])
  return out


def made_by(record: dict) -> dict:
  """What made a run's translations that a comparison holds alike: the engine, the checkpoint
  (which selection, its steps left out; which weights, "" where the run keeps one kind) and
  the decoding settings that change translations, from the record results.json keeps."""
  name = record["label"].partition("@")[0].partition("+")[0]
  weights = ""
  for kind in ("ema", "raw"):
    if name.endswith(f"_{kind}"):
      name, weights = name.removesuffix(f"_{kind}"), kind
  for pattern, form in _CHECKPOINT_FORMS:
    name = pattern.sub(form, name)
  name = re.sub(r"average_\d+(_\d+)+$", lambda m: f"average_of_{m[0].count('_')}", name)
  decode = layout.with_added_decode_keys(record.get("decode", {}))
  unused = list(_SAME_TRANSLATIONS)
  if not decode.get("sampling"):
    unused += ["seed", "temperature", "top_k", "top_p"]
  if decode.get("greedy") or decode.get("sampling"):
    unused += ["beam_size", "length_penalty", "min_length"]
  if not decode.get("mbr"):
    unused += ["mbr_candidates"]
  return {"engine": record.get("engine", "jax"), "checkpoint": name, "weights": weights,
          "decoding": {k: v for k, v in sorted(decode.items()) if k not in unused}}


def differences(like: dict, made: dict) -> list[str]:
  """How translations made as `made` says were made otherwise than `like` says (weights
  compared only where both runs have a choice)."""
  out = [f"{key} {made[key]} (not {like[key]})" for key in ("engine", "checkpoint")
         if made[key] != like[key]]
  if like["weights"] and made["weights"] and like["weights"] != made["weights"]:
    out.append(f"weights {made['weights']} (not {like['weights']})")
  ours, theirs = like["decoding"], made["decoding"]
  out += [f"{key}={theirs.get(key)} (not {ours.get(key)})" for key in sorted({*ours, *theirs})
          if ours.get(key) != theirs.get(key)]
  return out


def described(made: dict) -> str:
  """`made_by`'s record in a line: engine, checkpoint, decoding."""
  weights = f" ({made['weights']} weights)" if made["weights"] else ""
  return (f"engine {made['engine']}, checkpoint {made['checkpoint']}{weights}, decoding "
          + " ".join(f"{k}={v}" for k, v in made["decoding"].items()))


def _hypotheses(workdir: Path, set_name: str, label: str, like: dict | None
                ) -> tuple[Path, dict]:
  """The .hyp file and results.json record of `label` in the workdir's eval/<set>/ (default:
  its only set); without `label`, of the last evaluated made as `like` says (None: the last
  evaluated)."""
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
  records = [r for r in layout.read_results(folder) if not label or r["label"] == label]
  if not records:
    labels = sorted(p.stem for p in folder.glob("*.hyp"))
    raise Error(f"{folder}/results.json has no record of {label or 'any translations'} (the "
                f"translations there: {', '.join(labels) or 'none'}): what made them is not "
                "known; compare the .hyp files themselves (with --reference)")
  record = records[-1]
  if like is not None:
    alike = [r for r in records if not differences(like, made_by(r))]
    if not alike:
      raise Error(f"{folder} has no translations made alike ({described(like)}): "
                  f"{record['label']} differs in "
                  f"{'; '.join(differences(like, made_by(record)))}. Evaluate it alike "
                  "(transformer-jax-evaluate --engine, --checkpoint, --decode) or compare the "
                  ".hyp files themselves (with --reference)")
    record = alike[-1]
  path = folder / f"{record['label']}.hyp"
  if not path.is_file():
    labels = sorted(p.stem for p in folder.glob("*.hyp"))
    raise Error(f"{folder} has no translations {record['label']!r} (it has "
                f"{', '.join(labels)})")
  return path, record


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
  records = [r for s in (baseline, *systems) for r in s.records]
  if records:  # (what the runs' translations were made alike by)
    lines.append("translations made alike: " + described(made_by(records[0])))
  for system in [baseline, *systems]:
    if system.workdirs:
      lines.append(f"{system.name}: " + ", ".join(str(f) for f in system.files))
  report = {"test": test, "samples": samples, "seed": seed, "sentences": len(refs),
            "made_by": made_by(records[0]) if records else None, "systems": []}
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
