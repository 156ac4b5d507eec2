"""transformer-jax-export: a run's checkpoint selection becomes a CTranslate2 folder that loads
and scores as the run's model does (the moving average when the run keeps one), with its
tokenizer, record and README; what CTranslate2 cannot take is refused in one line."""

import json

import ctranslate2
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from transformer_jax.cli import export as export_cli
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.inference import trained_run
from transformer_jax.interop.ctranslate2_export import QUANTIZATIONS
from transformer_jax.model.transformer import unscanned

SOURCE, TARGET = "Ein Hund rennt durch den Schnee.", "A dog runs through the snow."


def _export(*args):
  return helpers.run_tool(export_cli.main, *args)


def _our_log_probs(run, selected):
  model, params = unscanned(run.model, run.params(selected))
  x = jnp.array([run.tokenizer.encode(SOURCE)])
  y = jnp.array([run.tokenizer.encode(TARGET)])
  logits = model.apply({"params": params}, x, y)[0].astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits.at[:, PAD_ID].set(-1e9))
  return np.asarray(log_probs[jnp.arange(y.shape[1]), y[0]])


def _their_log_probs(folder, run):
  translator = ctranslate2.Translator(str(folder), device="cpu")
  sp = run.tokenizer.sp
  return translator.score_batch([sp.encode(SOURCE, out_type=str)],
                                [sp.encode(TARGET, out_type=str)])[0].log_probs


def test_export_writes_a_folder_that_ctranslate2_loads_and_that_names_its_origin(tiny_run,
                                                                                   tmp_path):
  out = tmp_path / "tiny_ct2"
  status, stdout, err = _export(f"--workdir={tiny_run}", "--checkpoint=10", f"--out={out}")
  assert status == 0, err[-2000:]
  assert stdout.strip() == f"exported step_10 (steps [10], raw weights, float32) -> {out}"
  assert sorted(p.name for p in out.iterdir()) == [
      "README.md", "config.json", "export.json", "model.bin", "sentencepiece.model",
      "shared_vocabulary.json"]
  assert (out / "sentencepiece.model").read_bytes() == (tiny_run / "spm.model").read_bytes()
  record = json.loads((out / "export.json").read_text())
  assert (record["checkpoint"], record["steps"], record["weights"], record["quantization"]) == (
      "step_10", [10], "raw", "float32")
  assert record["translate_options"]["beam_size"] == 2
  assert record["translate_options"]["length_penalty"] == 0.6
  config = json.loads((out / "config.json").read_text())
  assert (config["decoder_start_token"], config["add_source_eos"]) == ("<pad>", True)
  readme = (out / "README.md").read_text()
  assert f"`{tiny_run.resolve()}`, checkpoint `step_10`" in readme
  assert 'ctranslate2.Translator("tiny_ct2")' in readme
  assert "((5 + length) / 6) ** 0.6 (GNMT)" in readme  # (what CTranslate2 does differently)
  run = trained_run.load(tiny_run)
  np.testing.assert_allclose(_their_log_probs(out, run),
                             _our_log_probs(run, run.select_one("10", "test")), atol=2e-5)
  # No partial folder left; the export's lock file stays beside it, as a workdir's .lock does.
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [".tiny_ct2.lock"]


def test_int8_weights_are_smaller_and_score_close(tiny_run, tmp_path):
  for quantization in ("float32", "int8"):
    status, _, err = _export(f"--workdir={tiny_run}", f"--out={tmp_path / quantization}",
                             f"--quantization={quantization}")
    assert status == 0, err[-2000:]
  size = {q: (tmp_path / q / "model.bin").stat().st_size for q in ("float32", "int8")}
  assert size["int8"] < 0.6 * size["float32"]
  run = trained_run.load(tiny_run)
  exact, quantized = (np.asarray(_their_log_probs(tmp_path / q, run))
                      for q in ("float32", "int8"))
  # (int8 rounding moves a sentence's log-probability in proportion to its size, by how much
  # depends on the CPU's int8 kernels: on an AVX2-only EPYC up to 0.27 for a mean |log-prob| of
  # 5.25, past the fixed 0.2 this bound was)
  assert 0 < np.abs(exact - quantized).max() < 0.07 * np.abs(exact).mean()


def test_the_moving_average_is_exported_when_the_run_keeps_one(tmp_path, tfds_cache,
                                                              tiny_tokenizer):
  workdir = tmp_path / "ema_run"
  helpers.train_in_process(workdir, tfds_cache, tiny_tokenizer, **{
      **helpers.ONE_LAYER, "optimizer.ema_decay": 0.9, "num_train_steps": 4,
      "eval_every_steps": 100, "checkpoint_every_steps": 4, "data.test_split": ""})
  run = trained_run.load(workdir)
  scores = {}
  for suffix, weights in (("", "ema"), (":raw", "raw")):
    out = tmp_path / f"ct2_{weights}"
    status, stdout, err = _export(f"--workdir={workdir}", f"--checkpoint=latest{suffix}",
                                  f"--out={out}")
    assert status == 0, err[-2000:]
    assert f"step_4_{weights} (steps [4], {weights} weights" in stdout
    scores[weights] = _their_log_probs(out, run)
    np.testing.assert_allclose(
        scores[weights], _our_log_probs(run, run.select_one(f"latest{suffix}", "test")),
        atol=2e-5)
  assert np.abs(np.subtract(scores["ema"], scores["raw"])).max() > 1e-3


@pytest.mark.parametrize("args, message", [
    (["--quantization=int4"], "export: --quantization='int4': CTranslate2 has no such weight "
                              "type; expected one of float32, float16, bfloat16, int8, "),
    (["--checkpoint=all"], "export: --checkpoint=all names 2 models; export takes one"),
    (["--checkpoint=average:9"], "export: average:9 needs 1..2 checkpoints; available steps: "
                                 "[10, 20]"),
])
def test_what_ctranslate2_or_an_export_cannot_take_is_one_line(tiny_run, tmp_path, args,
                                                               message):
  status, _, err = _export(f"--workdir={tiny_run}", f"--out={tmp_path / 'out'}", *args)
  assert status == 2 if "quantization" in message else status == 1
  assert helpers.one_line_error(err).startswith(message)
  assert not (tmp_path / "out").exists()


def test_the_quantizations_offered_are_ctranslate2s_weight_types():
  assert set(QUANTIZATIONS) == set(ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES)


def test_an_existing_folder_is_replaced_only_with_force(tiny_run, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "mine.txt").write_text("keep")
  status, _, err = _export(f"--workdir={tiny_run}", f"--out={out}")
  assert (status, helpers.one_line_error(err)) == (
      2, f"export: --out={out} exists: pass --force to replace it (--help lists the flags)")
  assert (out / "mine.txt").read_text() == "keep"
  status, _, err = _export(f"--workdir={tiny_run}", f"--out={out}", "--force")
  assert status == 0, err[-2000:]
  assert not (out / "mine.txt").exists() and (out / "model.bin").is_file()
