"""Scoring a trained run's checkpoints with sacreBLEU and chrF, on a split of its data or on any
pair of line-aligned files: one result per selected model (a step, the best, every checkpoint,
an average), side by side.

Writes `<workdir>/eval/<set>/<label>.hyp` and adds the results to `results.json` there (the
format training's final test writes); with `--checkpoint=all`, also `bleu_by_step.csv` and
`bleu_by_step.png`.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import itertools
import logging
import sys
import time
from pathlib import Path

import jax
from tqdm import tqdm

from transformer_jax import atomic
from transformer_jax.config.parse import replace_from_text
from transformer_jax.data.corpus import read_aligned
from transformer_jax.data.eval_sets import EvalSet, direction_set, load_eval_set, scoring_sets
from transformer_jax.data.plan import data_plan
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.errors import DataError, UsageError
from transformer_jax.evaluation import alignment, scoring
from transformer_jax.inference import trained_run
from transformer_jax.parallel import compilation
from transformer_jax.reporting import plots
from transformer_jax.workdir import layout, lock

log = logging.getLogger(__name__)


def _eval_sets(run: trained_run.TrainedRun, split: str, source_file: str, reference_file: str,
               max_sentences: int, source_tag: str = "") -> dict[str, EvalSet]:
  """The evaluation sets by name, each source after `source_tag` (a mixture corpus's set:
  after its own tag); a model of target-language tags needs one (`TrainedRun.untagged`)."""
  sets = _untagged_sets(run, split, source_file, reference_file, max_sentences)
  prefix = tuple(run.source_prefix(source_tag))
  for name, eval_set in sets.items():
    if eval_set.source_prefix:
      continue
    if prefix:
      sets[name] = EvalSet.from_pairs(eval_set.sources, eval_set.references, run.tokenizer,
                                      prefix)
    elif run.tokenizer.language_tags and not all(map(run.tokenizer.leading_tag,
                                                     eval_set.sources)):
      raise run.untagged(f"evaluation set {name}")
  return sets


def _untagged_sets(run: trained_run.TrainedRun, split: str, source_file: str,
                   reference_file: str, max_sentences: int) -> dict[str, EvalSet]:
  """The evaluation sets by name: the given files; a split of the run's data (or of a mixture
  corpus, `NAME.SPLIT`); by default its test sets (`test_split` and each direction's of a
  multilingual run), else its validation split."""
  cfg = run.cfg
  first = f".first{max_sentences}" if max_sentences else ""  # (a part: a set of its own)
  if source_file or reference_file:
    if not (source_file and reference_file):
      raise UsageError("--source_file and --reference_file go together")
    pairs = [(a, b) for _, a, b in read_aligned(Path(source_file), Path(reference_file))]
    if not pairs:
      raise DataError(f"--source_file={source_file} and --reference_file={reference_file} "
                      "have no lines: nothing to score")
    if max_sentences:
      pairs = pairs[:max_sentences]
    sources, references = [a for a, _ in pairs], [b for _, b in pairs]
    return {files_set_name(source_file, reference_file) + first:
            EvalSet.from_pairs(sources, references, run.tokenizer)}
  data = data_plan(cfg.data)
  if not split:
    sets = scoring_sets(data, run.tokenizer, max_sentences)
    if sets:
      return {name + first: eval_set for name, eval_set in sets.items()}
    split = cfg.data.eval_split
    log.warning("%s has no test split (config.data.test_split is empty): scoring its "
                "validation split %r instead (--split chooses another)", run.workdir, split)
  direction = direction_set(data, split, run.tokenizer, max_sentences)
  if direction is not None:
    return {split + first: direction}
  dataset = (cfg.data.test_dataset if split == cfg.data.test_split else
             cfg.data.eval_dataset if split == cfg.data.eval_split else "")
  return {split + first: load_eval_set(cfg.data, split, run.tokenizer, max_sentences, dataset)}


def writing_lock(workdir, output_dir: str):
  """Writing into the workdir: one writer at a time (the run's lock), taken only in a run's
  folder (a mistyped one is an error, not made); with `output_dir` elsewhere, evaluate only
  reads the run."""
  if output_dir:
    return contextlib.nullcontext()
  if not (Path(workdir) / lock.LOCK_FILE).exists():  # (a starting run has it, no config yet)
    layout.config_file(workdir)
  return lock.hold(workdir, "evaluate", way_out="wait for it to finish, or write the results "
                   "elsewhere with --output_dir=DIR (evaluate then only reads the run)")


def files_set_name(source_file: str, reference_file: str) -> str:
  """The name of a set of files: the source file's, and a fingerprint of both files' bytes
  (the same sentences, the same folder; other files of that name, another)."""
  digest = hashlib.sha256()
  for path in (source_file, reference_file):
    digest.update(Path(path).read_bytes())
    digest.update(b"\0")
  return f"{Path(source_file).name.removesuffix('.gz')}-{digest.hexdigest()[:8]}"


def evaluate_checkpoints(workdir, split: str = "", checkpoint: str | list[str] = "latest",
                         source_file: str = "", reference_file: str = "",
                         max_sentences: int = 0, decode_overrides=(), lowercase: bool = False,
                         output_dir: str = "", alignments: bool = False,
                         source_tag: str = "", dtype: str = "", engines=None
                         ) -> tuple[list[dict], list[Path]]:
  """Scores the selected checkpoint(s) of a workdir, or of several as an ensemble (each
  selection then names one model per run), on each evaluation set (`_eval_sets`); returns one
  result record per model and set (see `layout.result_record`) and the folders they were
  written to (in the first run's eval/, or output_dir: of several sets, a folder each). With
  `alignments`, each .hyp has an .align beside it (`evaluation.alignment`, default layer);
  `source_tag`: the tag before every source of a set that has none of its own; `dtype`: the
  matmuls' (`trained_run.load`); `engines`: {name: None (our search) or make(run, selected,
  decode) -> a `decoding.engine.Engine`} (`interop.engines.evaluation_engines`), another
  engine's results labelled `<checkpoint>@<name>`, what it ran recorded beside the decoding
  settings (`engine_settings`). Our search refuses an option
  it cannot honour (config.fields.Option.search)."""
  workdirs = [workdir] if isinstance(workdir, (str, Path)) else list(workdir)
  others = sorted(set(engines or {}) - {"jax"})
  if others and (alignments or len(workdirs) > 1):
    raise UsageError(f"--engine={others[0]}: " + ("no --alignments (our search's)" if alignments
                                                   else "one --workdir (no ensembles)"))
  runs = trained_run.load_ensemble(workdirs, dtype)
  run = runs[0]
  decode = replace_from_text(run.cfg.decode, list(decode_overrides), "decode")
  if "jax" in (engines or {"jax": None}):
    SearchEngine.check(decode)
  sets = _eval_sets(run, split, source_file, reference_file, max_sentences, source_tag)
  out_dirs = {name: (Path(output_dir) / name if output_dir and len(sets) > 1 else
                     Path(output_dir) if output_dir else layout.eval_dir(workdirs[0], name))
              for name in sets}
  for out_dir in out_dirs.values():
    layout.check_writable(out_dir)  # (before decoding: its results would have nowhere to go)
  selections = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
  chosen = []  # (one Selected per run) per model to score
  for selection in selections:
    per_run = [r.select(selection) for r in runs]
    if len(runs) > 1 and any(len(models) != 1 for models in per_run):
      raise UsageError(f"--checkpoint={selection} names several models of a run: an "
                       "ensemble takes one of each")
    chosen += list(zip(*per_run))
  files = ({"source_file": str(Path(source_file).absolute()),
            "reference_file": str(Path(reference_file).absolute())} if source_file else {})
  results = []
  for name, eval_set in sets.items():
    set_results = []
    for group, make in itertools.product(chosen, (engines or {"jax": None}).values()):
      # (each result saved as it comes: a later failure loses none)
      set_results.append({**_score(runs, group, eval_set, name, decode, decode_overrides,
                                   lowercase, out_dirs[name], alignments, make), **files})
      layout.write_results(out_dirs[name], set_results[-1:])
    if "all" in selections and set_results:
      for engine_name in engines or {"jax": None}:  # (a curve per engine)
        _write_by_step([r for r in set_results if r.get("engine", "jax") == engine_name],
                       out_dirs[name], "" if engine_name == "jax" else f"@{engine_name}")
    results += set_results
  return results, list(out_dirs.values())


def _score(runs, group, eval_set: EvalSet, name: str, decode, decode_overrides, lowercase: bool,
           out_dir: Path, alignments: bool = False, make=None) -> dict:
  """The result record of one model (a Selected per run) on one set, decoded by our search or
  by the engine `make` makes (see evaluate_checkpoints); its .hyp written (and its .align)."""
  if make is None:  # (as read: a damaged `latest` gives way to an older checkpoint)
    model, params, group = trained_run.ensemble_models(runs, list(group))
  t0, compiled = time.time(), compilation.program_seconds()
  if make is None:
    engine = SearchEngine(prepare(model, params), runs[0].tokenizer, decode, runs[0].mesh)
  else:  # (its export or the cache, and loading: counted in the decoding's time)
    engine = make(runs[0], group[0], decode)
  made = time.time() - t0
  selected = group[0]
  label = selected.label if len(runs) == 1 else f"ensemble{len(runs)}_{selected.label}"
  if decode_overrides:  # (another decoding of the same model: its own .hyp file and label)
    label += "+" + ",".join(decode_overrides)
  if make is not None:
    label += f"@{engine.name}"
  with tqdm(total=len(eval_set), unit="sent", file=sys.stderr, desc=f"{label} on {name}",
            disable=jax.process_index() != 0) as bar:
    translations = engine.translate_best(eval_set, decode, on_batch=bar.update)
  hyps = [h.text for h in translations]
  seconds = time.time() - t0
  # (preparing: ours, its programs; another engine, its export or the cache, and loading)
  prepared = compilation.program_seconds() - compiled if make is None else made
  result = layout.result_record(label, selected.steps, name,
                                scoring.score(hyps, eval_set.references), len(hyps), seconds,
                                decode, prepared)
  if make is not None:
    result["engine"] = engine.name  # (and what it ran: the best of each, `translate_best`)
    result["engine_settings"] = engine.settings(engine.best_only(decode))
  if len(runs) > 1:
    result["ensemble"] = [str(r.workdir) for r in runs]
  if lowercase:
    result["bleu_lowercase"], result["bleu_lowercase_signature"] = scoring.lowercase_bleu(
        hyps, eval_set.references)
  layout.write_lines(out_dir / f"{label}.hyp", hyps)
  if alignments and make is None:  # (other engines are refused with alignments)
    layout.write_lines(out_dir / f"{label}.align", alignment.align(
        model, params, runs[0].tokenizer, eval_set, [h.ids for h in translations]))
  log.info("%s on %s: BLEU %.2f, chrF %.2f%s", label, name, result["bleu"], result["chrf"],
           f"  lowercase BLEU {result['bleu_lowercase']:.2f}" if lowercase else "")
  return result


def _write_by_step(results: list[dict], out_dir: Path, suffix: str = ""):
  rows = [["step", "bleu", "chrf"]] + [[r["steps"][0], f"{r['bleu']:.2f}", f"{r['chrf']:.2f}"]
                                       for r in results]
  csv_path = out_dir / f"bleu_by_step{suffix}.csv"
  with atomic.replacing(csv_path) as tmp, tmp.open("w", newline="") as f:
    csv.writer(f).writerows(rows)
  plots.plot_bleu_by_step([r["steps"][0] for r in results], [r["bleu"] for r in results],
                          [r["chrf"] for r in results],
                          out_dir / f"bleu_by_step{suffix}.png")


def format_table(results: list[dict]) -> str:
  """The results side by side: checkpoint, BLEU, chrF, sentences/s."""
  width = max(len(r["label"]) for r in results)
  several = len({r["data"] for r in results}) > 1  # (a column naming each set)
  set_width = max(len(r["data"]) for r in results) + 2 if several else 0
  lines = [f"{'set':<{set_width}}"[:set_width] + f"{'checkpoint':<{width}}  {'BLEU':>6}  "
           f"{'chrF':>6}  sent/s"]
  for r in results:
    lines.append(f"{r['data']:<{set_width}}"[:set_width] + f"{r['label']:<{width}}  "
                 f"{r['bleu']:6.2f}  {r['chrf']:6.2f}  "
                 f"{r['sentences_per_sec']:6.1f}"
                 + (f"  (lowercase BLEU {r['bleu_lowercase']:.2f})" if "bleu_lowercase" in r
                    else ""))
  lines.append(f"({results[0]['bleu_signature']}; {results[0]['chrf_signature']})")
  return "\n".join(lines)
