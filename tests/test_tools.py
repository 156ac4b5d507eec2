"""evaluate, translate, averaging and attention maps on a trained tiny run."""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.conftest import ROOT
from transformer_jax import (attention_maps, checkpoints, corpus, data, evaluate, inference,
                             tokenizer)

ROOT_PATH = Path(ROOT)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  base = tmp_path_factory.mktemp("tiny_run")
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py",
                      f"--workdir={base / 'run'}", f"--config.data.cache_dir={base / 'tfds'}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return base / "run"


def _logged(workdir, key, step):
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r[key] for r in records if key in r and r["step"] == step][-1]


def test_evaluate_reproduces_the_bleu_logged_in_training(workdir):
  results = evaluate.run_evaluation(workdir, split="val", checkpoint="20", max_sentences=32)
  assert results[0]["steps"] == [20]
  assert results[0]["bleu"] == pytest.approx(_logged(workdir, "eval/bleu", 20), abs=1e-6)
  assert results[0]["chrf"] == pytest.approx(_logged(workdir, "eval/chrf", 20), abs=1e-6)
  out = workdir / "eval" / "val"
  assert json.loads((out / "results.json").read_text())[0]["bleu_signature"].startswith("nrefs")
  assert len((out / "step_20.hyp").read_text().splitlines()) == 32


def test_evaluate_every_checkpoint_writes_table_and_plot(workdir, tmp_path):
  results = evaluate.run_evaluation(workdir, split="val", checkpoint="all", max_sentences=8,
                                    output_dir=str(tmp_path), lowercase=True)
  assert [r["steps"] for r in results] == [[10], [20]]
  assert "bleu_lowercase" in results[0]
  assert (tmp_path / "bleu_by_step.csv").read_text().splitlines()[0] == "step,bleu,chrf"
  assert (tmp_path / "bleu_by_step.png").stat().st_size > 1000


def test_best_checkpoint_is_kept_by_validation_bleu(workdir, tmp_path):
  run = inference.load_run(workdir)
  best = run.best_step()
  bleus = {s: _logged(workdir, "eval/bleu", s) for s in (10, 20)}
  assert bleus[best] == max(bleus.values())
  # best and an average, side by side in one report
  results = evaluate.run_evaluation(workdir, split="val", checkpoint=["best", "average:2"],
                                    max_sentences=32, output_dir=str(tmp_path))
  assert [r["label"] for r in results] == [f"best_step_{best}", "average_last_2_to_20"]
  assert results[0]["bleu"] == pytest.approx(bleus[best], abs=1e-6)


def test_averaging_identical_and_different_checkpoints(workdir, tmp_path):
  run = inference.load_run(workdir)
  s10, s20 = run.state([10]), run.state([20])
  same = checkpoints.average_states([s20, s20, s20])
  for a, b in zip(jax.tree_util.tree_leaves(same.params), jax.tree_util.tree_leaves(s20.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
  mean = run.params([10, 20])
  for m, a, b in zip(*(jax.tree_util.tree_leaves(x) for x in (mean, s10.params, s20.params))):
    np.testing.assert_allclose(np.asarray(m), (np.asarray(a) + np.asarray(b)) / 2, rtol=1e-6)
  # The averaged checkpoint is a workdir that evaluate can use.
  from transformer_jax import average
  step, steps = average.average_to_workdir(str(workdir), "average:2", str(tmp_path / "avg"))
  assert (step, steps) == (20, [10, 20])
  res = evaluate.run_evaluation(tmp_path / "avg", split="val", max_sentences=8)
  assert res[0]["steps"] == [20]


def test_bad_checkpoint_selections_are_named(workdir):
  run = inference.load_run(workdir)
  with pytest.raises(checkpoints.CheckpointError, match=r"no checkpoint for step 15.*\[10, 20\]"):
    run.select("15")
  with pytest.raises(checkpoints.CheckpointError, match="unknown checkpoint selection"):
    run.select("newest")
  with pytest.raises(checkpoints.CheckpointError, match="no config.json"):
    inference.load_run(workdir / "checkpoints")


def _translate(workdir, stdin: bytes, *args):
  return subprocess.run([sys.executable, "-m", "transformer_jax.translate",
                         f"--workdir={workdir}", "--interactive=false", *args],
                        cwd=ROOT, input=stdin, capture_output=True, timeout=300)


def test_translate_keeps_line_alignment(workdir):
  lines = ["Ein Hund läuft.", "", "Zwei Männer " * 60, "?!...", "", "这是一个测试",
           "مرحبا بالعالم", "Eine Frau."]
  r = _translate(workdir, ("\n".join(lines) + "\n").encode())
  assert r.returncode == 0, r.stderr.decode()[-2000:]
  out = r.stdout.decode().split("\n")
  assert out[-1] == ""
  out = out[:-1]
  assert len(out) == len(lines)
  for src, hyp in zip(lines, out):
    assert (hyp == "") == (src == "")


def test_translate_nbest_output(workdir):
  r = _translate(workdir, b"Ein Hund.\n\nEine Katze.\n", "--decode=nbest=2")
  assert r.returncode == 0, r.stderr.decode()[-2000:]
  rows = [x.split(" ||| ") for x in r.stdout.decode().splitlines()]
  assert {int(x[0]) for x in rows} == {0, 2}
  for index in (0, 2):
    scores = [float(x[2]) for x in rows if int(x[0]) == index]
    assert scores == sorted(scores, reverse=True)


def test_translate_rejects_invalid_utf8_naming_the_line(workdir):
  r = _translate(workdir, b"gut\nauch gut\nkaputt \xff\n")
  assert r.returncode != 0
  assert "<stdin>:3: not valid UTF-8" in r.stderr.decode()


def test_attention_maps_rows_sum_to_one_and_masked_cells_are_zero(workdir, tmp_path):
  run = inference.load_run(workdir)
  params = run.params([20])
  tok = run.tokenizer
  src, tgt = tok.encode("Ein Mann fährt Fahrrad."), tok.encode("A man rides a bike.")
  weights = attention_maps.attention_weights(run.model, params, src, tgt)
  for kind, layers in weights.items():
    assert len(layers) == 2
    for w in layers:
      np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
      if kind == "decoder_self_attention":  # future positions get exactly zero weight
        T = w.shape[-1]
        assert np.all(w[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)
  # With padding after the sentence, the padded keys get exactly zero weight.
  padded_src = np.concatenate([src, [0, 0, 0]])
  w = attention_maps.attention_weights(run.model, params, padded_src, tgt)
  for kind in ("encoder_self_attention", "cross_attention"):
    for layer in w[kind]:
      real_rows = layer[:, :len(src) if kind.startswith("encoder") else len(tgt)]
      assert np.all(real_rows[..., len(src):] == 0.0)
      np.testing.assert_allclose(real_rows.sum(-1), 1.0, atol=1e-5)
  paths = attention_maps.plot_attention(weights, tok.pieces(src), tok.pieces(tgt), tmp_path)
  assert len(paths) == 6 and all(p.stat().st_size > 1000 for p in paths)


def test_evaluate_scores_a_local_test_set_of_gzipped_files(workdir, tmp_path):
  # Out-of-domain evaluation: any line-aligned pair of files, e.g. WMT newstest (.gz or plain).
  # The first 8 val pairs as files score what the same pairs score as the val split.
  pairs = list(corpus.iterate_pairs(inference.load_run(workdir).cfg.data.corpus_spec(), "val"))
  src, ref = tmp_path / "news.de.gz", tmp_path / "news.en"
  src.write_bytes(gzip.compress("".join(s + "\n" for s, _ in pairs[:8]).encode()))
  ref.write_text("".join(r + "\n" for _, r in pairs[:8]))
  from_files = evaluate.run_evaluation(workdir, checkpoint="20", source_file=str(src),
                                       reference_file=str(ref))
  from_split = evaluate.run_evaluation(workdir, split="val", checkpoint="20", max_sentences=8,
                                       output_dir=str(tmp_path / "split"))
  assert from_files[0]["data"] == "news.de" and from_files[0]["sentences"] == 8
  assert from_files[0]["bleu"] == pytest.approx(from_split[0]["bleu"], abs=1e-6)
  assert len((workdir / "eval" / "news.de" / "step_20.hyp").read_text().splitlines()) == 8
  ref.write_text("only one line\n")
  with pytest.raises(ValueError, match=r"news\.de\.gz has 8 lines, .*news\.en has 1"):
    evaluate.run_evaluation(workdir, checkpoint="20", source_file=str(src),
                            reference_file=str(ref))


def test_eval_set_from_pairs_handles_translation_without_references():
  class Tok:
    def encode(self, s):
      return [3] * len(s.split()) + [1]
  ev = data.EvalSet.from_pairs(["a b", "c"], [], Tok())
  assert ev.references == ["", ""] and len(ev) == 2


def test_workdir_without_checkpoints_is_named(workdir, tmp_path):
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "spm.model", "tokenizer.json"):
    shutil.copy(workdir / name, bare / name)
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoints in .*bare/checkpoints"):
    inference.load_run(bare)
  (bare / "checkpoints").mkdir()
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoints yet"):
    inference.load_run(bare).select("latest")
  r = subprocess.run([sys.executable, "-m", "transformer_jax.evaluate", f"--workdir={bare}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "evaluate: " in r.stderr and "no checkpoints yet" in r.stderr
  assert "Traceback" not in r.stderr


def test_tokenizer_that_does_not_match_the_run_is_named(workdir, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  for name in ("config.json", "tokenizer.json"):
    shutil.copy(workdir / name, other / name)
  (other / "checkpoints").symlink_to(workdir / "checkpoints")
  sentences = list(corpus.read_lines(ROOT_PATH / "transformer_jax/corpora/multi30k/val.en.gz"))
  tokenizer.train_tokenizer(sentences, 300, other / "spm.model")  # another vocabulary
  with pytest.raises(checkpoints.CheckpointError, match="spm.model is not the one .* trained with"):
    inference.load_run(other)
  r = _translate(other, b"Ein Hund.\n")
  assert r.returncode != 0 and b"translate: tokenizer" in r.stderr
  assert b"Traceback" not in r.stderr
