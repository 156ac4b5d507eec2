"""Training's evaluations: validation at intervals (loss, BLEU, chrF, sample translations)
and the test at the end, on config.data's splits and, for a mixture, on each corpus's own
(one per direction of a multilingual model, its tag before each source). The main set's
metrics are `eval/...` and `test/...`; a corpus's `eval/NAME.SPLIT/...`."""

from __future__ import annotations

import logging
import time

import jax

from transformer_jax.data.eval_sets import scoring_sets, validation_sets
from transformer_jax.evaluation.evaluator import Evaluator, sample_translations
from transformer_jax.parallel import compilation
from transformer_jax.reporting.metrics import MetricWriter
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)


def evaluators(cfg, data, model, tokenizer, mesh, cancelled) -> dict[str, Evaluator]:
  """The validation sets of `data` (the plan of cfg.data), each an evaluator: ""
  (config.data.eval_split, unless ""), then each corpus's."""
  sets = validation_sets(data, tokenizer, cfg.eval_max_sentences)
  return {name: Evaluator(eval_set, model, tokenizer, cfg.decode, mesh, cancelled=cancelled)
          for name, eval_set in sets.items()}


def validate(evaluators_: dict[str, Evaluator], params, step: int, writer: MetricWriter,
             samples: int, final: dict, workdir=None) -> float:
  """Validation BLEU, chrF and loss on each set, logged and written (the main set's
  translations into `workdir`'s validation/, when given); returns what the best checkpoint
  and early stopping follow: the main set's BLEU, or without one (a multilingual run whose
  config.data.eval_split is "") the mean over the corpora's sets."""
  bleus = {}
  for name, evaluator in evaluators_.items():
    t_eval = time.time()
    prefix = f"eval/{name}/" if name else "eval/"
    log.info("step %d: validating on %d sentences%s", step, len(evaluator.eval_set),
             f" of {name}" if name else "")
    score, hyps = evaluator.bleu(params)
    if workdir is not None and not name:
      layout.save_validation(workdir, step, hyps, evaluator.eval_set.references, score)
    eval_metrics = {f"{prefix}loss": evaluator.loss(params), f"{prefix}bleu": score.bleu,
                    f"{prefix}chrf": score.chrf}
    writer.write(step, eval_metrics)
    text = sample_translations(evaluator.eval_set, hyps, samples)
    if text:
      log.info("eval sample translations%s:\n%s", f" of {name}" if name else "", text)
    writer.write_text(step, f"{prefix}samples", text)
    log.info("step %d: %s loss %.4f, %s [%.1fs]", step, name or "eval",
             eval_metrics[f"{prefix}loss"], score, time.time() - t_eval)
    final.update(eval_metrics)
    bleus[name] = score.bleu
  return bleus[""] if "" in bleus else sum(bleus.values()) / len(bleus)


def test(cfg, data, workdir, model, params, tokenizer, mesh, writer, step
         ) -> dict[str, float]:
  """BLEU on each test set of `data` (the plan of cfg.data); the translations and
  results.json go to eval/<set>/ as `evaluate` writes them. Metrics: test/... for
  config.data.test_split, test/NAME.SPLIT/... for a corpus's."""
  result = {}
  for name, eval_set in scoring_sets(data, tokenizer).items():
    t0, prepared = time.time(), compilation.program_seconds()
    score, hyps = Evaluator(eval_set, model, tokenizer, cfg.decode, mesh).bleu(params)
    seconds, prepared = time.time() - t0, compilation.program_seconds() - prepared
    label = f"step_{step}" + ("_ema" if cfg.optimizer.ema_decay else "")  # (as evaluate does)
    out_dir = layout.eval_dir(workdir, name)
    layout.write_lines(out_dir / f"{label}.hyp", hyps)
    layout.write_lines(out_dir / "references.txt", eval_set.references)
    layout.write_results(out_dir, [layout.result_record(
        label, [step], name, score, len(hyps), seconds, cfg.decode, prepared)])
    prefix = "test/" if name == cfg.data.test_split else f"test/{name}/"
    metrics = {f"{prefix}bleu": score.bleu, f"{prefix}chrf": score.chrf,
               ("perf/test_" if name == cfg.data.test_split else f"perf/test/{name}/")
               + "decode_sentences_per_sec": len(hyps) / seconds}
    writer.write(step, metrics)
    result.update(metrics)
    samples = sample_translations(eval_set, hyps, cfg.decode.num_samples_to_log)
    if samples:
      log.info("test sample translations of %s:\n%s", name, samples)
    if jax.process_index() == 0:
      print(f"\n{name} ({len(hyps)} sentences, beam {cfg.decode.beam_size}, "
            f"{len(hyps) / seconds:.1f} sent/s):\n  {score}\n{samples}", flush=True)
  return result
