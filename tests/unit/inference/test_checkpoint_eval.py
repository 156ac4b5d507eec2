"""Scoring a trained run's checkpoints: the BLEU training logged, every checkpoint with a table
and plot, the best and an average side by side, any pair of (gzipped) files, and what goes
wrong said in one line."""

import dataclasses
import gzip
import json
import logging
import re
import shutil

import pytest

from tests import helpers
from transformer_jax.cli import evaluate as evaluate_cli
from transformer_jax.config import fields
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import CheckpointError, DataError, UsageError
from transformer_jax.inference import checkpoint_eval, trained_run
from transformer_jax.inference.checkpoint_eval import evaluate_checkpoints, format_table


@pytest.fixture()
def workdir(tiny_run, tmp_path):
  return helpers.copy_run(tiny_run, tmp_path / "run")


def test_evaluate_reproduces_the_bleu_logged_in_training(workdir):
  results, (out,) = evaluate_checkpoints(workdir, split="val", checkpoint="20", max_sentences=32)
  assert results[0]["steps"] == [20] and out == workdir / "eval" / "val.first32"
  assert results[0]["bleu"] == pytest.approx(helpers.logged(workdir, "eval/bleu", 20), abs=1e-6)
  assert results[0]["chrf"] == pytest.approx(helpers.logged(workdir, "eval/chrf", 20), abs=1e-6)
  assert json.loads((out / "results.json").read_text())[0]["bleu_signature"].startswith("nrefs")
  assert len((out / "step_20.hyp").read_text().splitlines()) == 32
  # Evaluating again adds to results.json: another checkpoint beside, the same one replaced.
  evaluate_checkpoints(workdir, split="val", checkpoint="10", max_sentences=32)
  evaluate_checkpoints(workdir, split="val", checkpoint="20", max_sentences=32)
  saved = json.loads((out / "results.json").read_text())
  assert sorted(r["label"] for r in saved) == ["step_10", "step_20"]


def test_evaluate_every_checkpoint_writes_table_and_plot(tiny_run, tmp_path):
  results, _ = evaluate_checkpoints(tiny_run, split="val", checkpoint="all", max_sentences=8,
                                    output_dir=str(tmp_path), lowercase=True)
  assert [r["steps"] for r in results] == [[10], [20]]
  assert "bleu_lowercase" in results[0]
  assert (tmp_path / "bleu_by_step.csv").read_text().splitlines()[0] == "step,bleu,chrf"
  assert (tmp_path / "bleu_by_step.png").stat().st_size > 1000
  table = format_table(results).splitlines()
  assert table[0].split() == ["checkpoint", "BLEU", "chrF", "sent/s"]
  assert [line.split()[0] for line in table[1:3]] == ["step_10", "step_20"]
  assert "lowercase BLEU" in table[1] and table[-1].startswith("(nrefs:1")


def test_best_checkpoint_is_kept_by_validation_bleu(tiny_run, tmp_path):
  run = trained_run.load(tiny_run)
  best = run.best_step()
  bleus = {s: helpers.logged(tiny_run, "eval/bleu", s) for s in (10, 20)}
  assert bleus[best] == max(bleus.values())
  # best and an average, side by side in one report
  results, _ = evaluate_checkpoints(tiny_run, split="val", checkpoint=["best", "average:2"],
                                    max_sentences=32, output_dir=str(tmp_path))
  assert [r["label"] for r in results] == [f"best_step_{best}", "average_last_2_to_20"]
  assert results[0]["bleu"] == pytest.approx(bleus[best], abs=1e-6)


def test_evaluate_scores_a_local_test_set_of_gzipped_files(workdir, tmp_path):
  # Out-of-domain evaluation: any line-aligned pair of files, e.g. WMT newstest (.gz or plain).
  # The first 8 val pairs as files score what the same pairs score as the val split.
  run = trained_run.load(workdir)
  pairs = list(corpus.iterate_pairs(corpus.corpus_spec(run.cfg.data), "val"))
  src, ref = tmp_path / "news.de.gz", tmp_path / "news.en"
  src.write_bytes(gzip.compress("".join(s + "\n" for s, _ in pairs[:8]).encode()))
  ref.write_text("".join(r + "\n" for _, r in pairs[:8]))
  from_files, _ = evaluate_checkpoints(workdir, checkpoint="20", source_file=str(src),
                                       reference_file=str(ref))
  from_split, _ = evaluate_checkpoints(workdir, split="val", checkpoint="20", max_sentences=8,
                                       output_dir=str(tmp_path / "split"))
  name = from_files[0]["data"]
  assert re.fullmatch(r"news\.de-[0-9a-f]{8}", name) and from_files[0]["sentences"] == 8
  assert from_files[0]["source_file"] == str(src) and from_files[0]["reference_file"] == str(ref)
  assert from_files[0]["bleu"] == pytest.approx(from_split[0]["bleu"], abs=1e-6)
  assert len((workdir / "eval" / name / "step_20.hyp").read_text().splitlines()) == 8
  # Other files of the same name: a folder of their own, the first set's results kept.
  other = tmp_path / "other"
  other.mkdir()
  (other / "news.de.gz").write_bytes(gzip.compress(b"Ein Hund.\nEine Katze.\n"))
  (other / "news.en").write_text("A dog.\nA cat.\n")
  second, _ = evaluate_checkpoints(workdir, checkpoint="20", source_file=str(other / "news.de.gz"),
                                   reference_file=str(other / "news.en"))
  assert second[0]["data"] != name and second[0]["sentences"] == 2
  assert json.loads((workdir / "eval" / name / "results.json").read_text())[0]["sentences"] == 8
  ref.write_text("only one line\n")
  with pytest.raises(DataError, match=r"news\.de\.gz has 8 lines, .*news\.en has 1"):
    evaluate_checkpoints(workdir, checkpoint="20", source_file=str(src),
                         reference_file=str(ref))


def test_empty_files_are_one_line_and_leave_no_folder(workdir, tmp_path):
  (tmp_path / "empty.de").write_text("")
  (tmp_path / "empty.en").write_text("")
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={workdir}",
                                    f"--source_file={tmp_path / 'empty.de'}",
                                    f"--reference_file={tmp_path / 'empty.en'}")
  assert status == 1 and helpers.one_line_error(err).endswith("have no lines: nothing to score")
  assert not (workdir / "eval").exists()


def test_a_checkpoint_deleted_under_evaluate_keeps_the_results_of_those_scored(
    workdir, monkeypatch):
  """A run that keeps only its newest checkpoints may delete one while `--checkpoint=all`
  scores the others: the error names it, and results.json holds every result before it."""
  score = checkpoint_eval._score

  def score_then_delete_step_20(runs, group, *args, **kwargs):
    result = score(runs, group, *args, **kwargs)
    shutil.rmtree(workdir / "checkpoints" / "20")
    return result

  monkeypatch.setattr(checkpoint_eval, "_score", score_then_delete_step_20)
  with pytest.raises(CheckpointError, match="20"):
    evaluate_checkpoints(workdir, split="val", checkpoint="all", max_sentences=8)
  saved = json.loads((workdir / "eval" / "val.first8" / "results.json").read_text())
  assert [r["label"] for r in saved] == ["step_10"]


def test_the_evaluate_tool_prints_the_table_and_says_what_is_wrong(tiny_run, tmp_path):
  status, out, _ = helpers.run_tool(evaluate_cli.main, f"--workdir={tiny_run}", "--split=val",
                                    "--checkpoint=10", "--checkpoint=20", "--max_sentences=4",
                                    f"--output_dir={tmp_path / 'out'}", "--alignments")
  assert status == 0
  assert [line.split()[0] for line in out.splitlines()[1:3]] == ["step_10", "step_20"]
  assert len((tmp_path / "out" / "step_20.align").read_text().splitlines()) == 4
  assert f"wrote {tmp_path / 'out'}/results.json" in out
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "spm.model", "tokenizer.json"):
    shutil.copy(tiny_run / name, bare / name)
  (bare / "checkpoints").mkdir()
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={bare}")
  assert status == 1
  assert helpers.one_line_error(err) == "evaluate: the workdir has no checkpoints yet"
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={tiny_run}",
                                    "--source_file=x.de")
  assert status == 2 and "--source_file and --reference_file go together" in err
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={tmp_path / 'typo'}")
  assert status == 1 and helpers.one_line_error(err) == (
      f"evaluate: {tmp_path / 'typo'} has no config.json: not a transformer_jax workdir "
      "(training writes it)")
  assert not (tmp_path / "typo").exists()  # (no folder made, no lock left in it)


def test_evaluate_refuses_an_option_our_search_cannot_honour(tiny_run, tmp_path, monkeypatch):
  """(as its declaration says; here no_repeat_ngram_size declared without our search)"""
  declared = fields.options(DecodeConfig)
  monkeypatch.setattr(fields, "options", lambda cls: {**declared, "no_repeat_ngram_size": (
      dataclasses.replace(declared["no_repeat_ngram_size"], search=False))})
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={tiny_run}",
                                    f"--output_dir={tmp_path / 'out'}",
                                    "--decode=no_repeat_ngram_size=3")
  assert status == 2 and helpers.one_line_error(err) == (
      "config error: decode.no_repeat_ngram_size=3: the jax engine cannot honour it (leave it "
      "at 0, or use --engine=ctranslate2)")


def test_a_run_without_a_test_split_is_scored_on_its_validation_split_saying_so(tiny_run,
                                                                                 caplog):
  ours = logging.getLogger("transformer_jax")  # (whose lines the tools' set-up keeps to itself)
  ours.addHandler(caplog.handler)
  try:
    sets = checkpoint_eval._eval_sets(trained_run.load(tiny_run), "", "", "", 2)
  finally:
    ours.removeHandler(caplog.handler)
  assert list(sets) == ["val.first2"]
  assert f"{tiny_run} has no test split (config.data.test_split is empty): scoring its " \
      "validation split 'val' instead (--split chooses another)" in caplog.messages


def test_an_ensemble_of_a_run_with_itself_scores_as_the_run(tiny_run, tmp_path):
  alone, _ = evaluate_checkpoints(tiny_run, split="val", checkpoint="20", max_sentences=8,
                                  output_dir=str(tmp_path / "alone"))
  pair, (out,) = evaluate_checkpoints([tiny_run, tiny_run], split="val", checkpoint="20",
                                   max_sentences=8, output_dir=str(tmp_path / "pair"))
  assert pair[0]["label"] == "ensemble2_step_20" and pair[0]["ensemble"] == [str(tiny_run)] * 2
  assert pair[0]["bleu"] == alone[0]["bleu"] and pair[0]["chrf"] == alone[0]["chrf"]
  assert (out / "ensemble2_step_20.hyp").read_text() == (
      tmp_path / "alone" / "step_20.hyp").read_text()
  with pytest.raises(UsageError, match="names several models of a run"):
    evaluate_checkpoints([tiny_run, tiny_run], split="val", checkpoint="all", max_sentences=8,
                         output_dir=str(tmp_path / "all"))


def test_an_ensemble_refuses_runs_with_different_tokenizers(tiny_run, tmp_path):
  other = helpers.copy_run(tiny_run, tmp_path / "other")
  (other / "tokenizer.json").unlink()
  train_tokenizer(["ein ganz anderer satz", "a whole other sentence"] * 20, 40,
                  other / "spm.model")
  with pytest.raises(CheckpointError, match=rf"--workdir={other}: its tokenizer .* is not that "
                                            rf"of --workdir={tiny_run} .*one vocabulary"):
    evaluate_checkpoints([tiny_run, other], split="val", max_sentences=8,
                         output_dir=str(tmp_path / "x"))


def test_another_decoding_of_a_model_gets_its_own_label_and_file(tiny_run, tmp_path):
  out = tmp_path / "out"
  plain, _ = evaluate_checkpoints(tiny_run, split="val", checkpoint="20", max_sentences=8,
                                  output_dir=str(out))
  mbr, _ = evaluate_checkpoints(tiny_run, split="val", checkpoint="20", max_sentences=8,
                                decode_overrides=["mbr=chrf", "mbr_candidates=2"],
                                output_dir=str(out))
  assert plain[0]["label"] == "step_20"
  assert mbr[0]["label"] == "step_20+mbr=chrf,mbr_candidates=2"
  assert mbr[0]["decode"]["mbr"] == "chrf"
  assert sorted(p.name for p in out.glob("*.hyp")) == ["step_20+mbr=chrf,mbr_candidates=2.hyp",
                                                       "step_20.hyp"]
  assert [r["label"] for r in json.loads((out / "results.json").read_text())] == [
      "step_20", "step_20+mbr=chrf,mbr_candidates=2"]
