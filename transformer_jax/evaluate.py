"""BLEU and chrF (sacreBLEU, with signatures) of translations, and the `evaluate` CLI.

  python -m transformer_jax.evaluate --workdir=runs/default [--split=test2016]
      [--checkpoint=latest|best|all|STEP|average:N|steps:A,B ...] [--decode beam_size=5 ...]
  python -m transformer_jax.evaluate --workdir=runs/default --source_file=newstest.de \
      --reference_file=newstest.en

Writes `<workdir>/eval/<split>/<label>.hyp` and `results.json` (metrics, signatures,
checkpoint steps, decoding settings); with `--checkpoint=all`, also `bleu_by_step.csv` and
`bleu_by_step.png`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

import sacrebleu


@dataclasses.dataclass(frozen=True)
class Score:
  bleu: float
  bleu_signature: str
  chrf: float
  chrf_signature: str

  def __str__(self):
    return (f"BLEU {self.bleu:.2f} ({self.bleu_signature})  "
            f"chrF {self.chrf:.2f} ({self.chrf_signature})")


def score(hypotheses: list[str], references: list[str]) -> Score:
  """Corpus sacreBLEU (cased, 13a tokenizer) and chrF of detokenized hypotheses vs references."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
  b = bleu.corpus_score(hypotheses, [references])
  c = chrf.corpus_score(hypotheses, [references])
  return Score(b.score, str(bleu.get_signature()), c.score, str(chrf.get_signature()))


def lowercase_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """Lowercased BLEU (13a-tokenized), for comparison with papers that report it."""
  bleu = sacrebleu.BLEU(lowercase=True)
  return bleu.corpus_score(hypotheses, [references]).score, str(bleu.get_signature())


def _report(results: list[dict]) -> str:
  width = max(len(r["label"]) for r in results)
  lines = [f"{'checkpoint':<{width}}  {'BLEU':>6}  {'chrF':>6}  sent/s"]
  for r in results:
    lines.append(f"{r['label']:<{width}}  {r['bleu']:6.2f}  {r['chrf']:6.2f}  "
                 f"{r['sentences_per_sec']:6.1f}")
  return "\n".join(lines)


def _plot_by_step(results: list[dict], path: Path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps = [r["steps"][0] for r in results]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(steps, [r["bleu"] for r in results], marker="o", label="BLEU")
  ax.plot(steps, [r["chrf"] for r in results], marker=".", label="chrF")
  ax.set_xlabel("step")
  ax.set_ylabel("score")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def run_evaluation(workdir, split: str = "", checkpoint: str | list[str] = "latest",
                   source_file: str = "",
                   reference_file: str = "", max_sentences: int = 0,
                   decode_overrides: tuple[str, ...] = (), lowercase: bool = False,
                   output_dir: str = "") -> list[dict]:
  """Evaluates the selected checkpoint(s) of a workdir; returns one result dict each."""
  from transformer_jax import data, decode, inference
  run = inference.load_run(workdir)
  cfg = run.cfg
  decode_cfg = inference.decode_config(cfg.decode, list(decode_overrides))
  if source_file or reference_file:
    if not (source_file and reference_file):
      raise ValueError("--source_file and --reference_file go together")
    sources = list(_read_text(Path(source_file)))
    references = list(_read_text(Path(reference_file)))
    if len(sources) != len(references):
      raise ValueError(f"{source_file} has {len(sources)} lines, {reference_file} has "
                       f"{len(references)}")
    if max_sentences:
      sources, references = sources[:max_sentences], references[:max_sentences]
    eval_set = data.EvalSet.from_pairs(sources, references, run.tokenizer)
    name = Path(source_file).name.removesuffix(".gz")
  else:
    split = split or cfg.data.test_split or cfg.data.eval_split
    dataset = (cfg.data.test_dataset if split == cfg.data.test_split else
               cfg.data.eval_dataset if split == cfg.data.eval_split else "")
    eval_set = data.load_eval_set(cfg.data, split, run.tokenizer, max_sentences, dataset)
    name = split
  out_dir = Path(output_dir) if output_dir else Path(workdir) / "eval" / name
  out_dir.mkdir(parents=True, exist_ok=True)
  selections = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
  chosen = [model for selection in selections for model in run.select(selection)]
  results = []
  for label, steps, from_best in chosen:
    params = run.params(steps, from_best)
    t0 = time.time()
    hyps = decode.translate(run.model, params, eval_set, run.tokenizer, decode_cfg, run.mesh)
    seconds = time.time() - t0
    s = score(hyps, eval_set.references)
    result = {"label": label, "steps": steps, "data": name, "sentences": len(hyps),
              "bleu": s.bleu, "bleu_signature": s.bleu_signature, "chrf": s.chrf,
              "chrf_signature": s.chrf_signature, "sentences_per_sec": len(hyps) / seconds,
              "decode": dataclasses.asdict(decode_cfg)}
    if lowercase:
      result["bleu_lowercase"], result["bleu_lowercase_signature"] = lowercase_bleu(
          hyps, eval_set.references)
    (out_dir / f"{label}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(f"{label}: {s}" + (f"  lowercase BLEU {result['bleu_lowercase']:.2f}"
                              if lowercase else ""), flush=True)
    results.append(result)
  (out_dir / "results.json").write_text(json.dumps(results, indent=2))
  print(_report(results))
  if "all" in selections and results:
    with (out_dir / "bleu_by_step.csv").open("w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["step", "bleu", "chrf"])
      for r in results:
        writer.writerow([r["steps"][0], f"{r['bleu']:.2f}", f"{r['chrf']:.2f}"])
    _plot_by_step(results, out_dir / "bleu_by_step.png")
  print(f"wrote {out_dir}/results.json")
  return results


def _read_text(path: Path):
  from transformer_jax import corpus
  if not path.is_file():
    raise corpus.DataError(f"file {path} does not exist")
  return corpus.read_lines(path)


def main(argv=None):
  from absl import app, flags

  from transformer_jax.metrics import quiet_libraries
  flags.DEFINE_string("workdir", None, "A training workdir (config.json, spm.model, "
                      "checkpoints/).")
  flags.DEFINE_string("split", "", "Split of the configured dataset (default: its test split).")
  flags.DEFINE_multi_string("checkpoint", ["latest"],
                            "latest | best | all | STEP | average:N | steps:A,B,...; repeat "
                            "the flag to compare several side by side")
  flags.DEFINE_string("source_file", "", "Evaluate on this source text file (with "
                      "--reference_file) instead of a split.")
  flags.DEFINE_string("reference_file", "", "Reference translations of --source_file.")
  flags.DEFINE_integer("max_sentences", 0, "Evaluate on the first N sentences only (0 = all).")
  flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size, "
                            "length_penalty, max_length, greedy, sampling, ...); repeatable.")
  flags.DEFINE_bool("lowercase", False, "Also report lowercased BLEU.")
  flags.DEFINE_string("output_dir", "", "Where to write (default <workdir>/eval/<split>).")
  flags.mark_flag_as_required("workdir")
  FLAGS = flags.FLAGS

  def _main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    quiet_libraries()
    from transformer_jax.checkpoints import CheckpointError
    from transformer_jax.corpus import DataError
    try:
      run_evaluation(FLAGS.workdir, FLAGS.split, FLAGS.checkpoint, FLAGS.source_file,
                     FLAGS.reference_file, FLAGS.max_sentences, tuple(FLAGS.decode),
                     FLAGS.lowercase, FLAGS.output_dir)
    except (CheckpointError, DataError, ValueError, FileNotFoundError) as e:
      sys.exit(f"evaluate: {e}")

  app.run(_main, argv=argv)


if __name__ == "__main__":
  main()
