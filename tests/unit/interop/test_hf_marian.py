"""Hugging Face Marian models imported as runs compute what transformers' MarianMTModel does:
random-weight models of a few shapes, saved with save_pretrained, give the same teacher-forced
log-probabilities (to 1e-4) and the same greedy translations, and CTranslate2 scores an imported
model exported as ours does; what cannot be mapped is refused, named."""

import json
import sys

import ctranslate2
import jax
import numpy as np
import pytest
import torch

from tests import helpers, marian
from transformer_jax.cli import evaluate, import_model, translate
from transformer_jax.config import files
from transformer_jax.config.parse import from_config_dict
from transformer_jax.data import tokenizer as T
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.decoding.search import greedy_search
from transformer_jax.errors import CheckpointError
from transformer_jax.inference import trained_run
from transformer_jax.interop import ctranslate2_export, hf_marian, imported_run
from transformer_jax.training.run import open_run

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.",
          "Eine Frau liest ein Buch im Park.", "Kinder spielen."]
ENGLISH = ["A man rides a bike.", "Two dogs play in the snow.",
           "A woman reads a book in the park.", "Children play."]

SHAPES = {  # MarianConfig keys: tied and untied output, shared and separate tables, stacks
    "tied_2_1_swish_scaled": dict(encoder_layers=2, decoder_layers=1, scale_embedding=True,
                                  activation_function="swish"),
    "untied_1_2_gelu_unscaled": dict(encoder_layers=1, decoder_layers=2, tie_word_embeddings=False,
                                     activation_function="gelu", scale_embedding=False),
    "separate_tables_2_2_relu": dict(encoder_layers=2, decoder_layers=2,
                                     share_encoder_decoder_embeddings=False,
                                     activation_function="relu"),
}


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory):
  """A German source and an English target SentencePiece model (small: 50 pieces)."""
  folder = tmp_path_factory.mktemp("spm")
  T.train_tokenizer(GERMAN * 20, 50, folder / "source.spm")
  T.train_tokenizer(ENGLISH * 20, 50, folder / "target.spm")
  return folder / "source.spm", folder / "target.spm"


def _marian_folder(folder, spm_models, **options):
  return marian.folder(folder, *spm_models, **options)


def _padded(rows, pad):
  width = max(map(len, rows))
  return np.array([row + [pad] * (width - len(row)) for row in rows])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_imported_marian_model_scores_and_translates_as_transformers_does(
    shape, spm_models, tmp_path):
  hf_model = _marian_folder(tmp_path / "opus-mt-de-en", spm_models, **SHAPES[shape])
  workdir = hf_marian.import_run(tmp_path / "opus-mt-de-en", tmp_path / "run", "de", "en")
  run = trained_run.load(workdir, dtype="float32")
  params = run.params(run.select_one("latest", "test"))
  tok = run.tokenizer
  order, _ = hf_marian.vocabulary(tmp_path / "opus-mt-de-en", hf_model.config.to_dict())
  order = np.asarray(order)  # Marian's id of each of ours
  pad = hf_model.config.pad_token_id

  sources = [tok.encode(s) for s in GERMAN]
  targets = [tok.encode(t, "target") for t in ENGLISH]
  x, y = _padded(sources, 0), _padded(targets, 0)
  ours = jax.nn.log_softmax(run.model.apply({"params": params}, x, y), axis=-1)
  with torch.no_grad():
    theirs = hf_model(
        input_ids=torch.tensor(_padded([list(order[s]) for s in sources], pad)),
        attention_mask=torch.tensor(x > 0),
        decoder_input_ids=torch.tensor(_padded([[pad] + list(order[t][:-1]) for t in targets],
                                               pad))).logits
  theirs = torch.log_softmax(theirs, -1).numpy()[..., order]  # (in our id order)
  real = y > 0
  assert real.sum() > 20
  np.testing.assert_allclose(np.asarray(ours)[real], theirs[real], atol=1e-4, rtol=0)

  seqs, _ = greedy_search(prepare(run.model, params), x, max_len=12)
  with torch.no_grad():
    generated = hf_model.generate(
        input_ids=torch.tensor(_padded([list(order[s]) for s in sources], pad)),
        attention_mask=torch.tensor(x > 0), num_beams=1, do_sample=False, max_new_tokens=12,
        bad_words_ids=[[pad]]).numpy()[:, 1:]  # (after the start token)
  inverse = np.argsort(order)  # our id of each of Marian's
  for ours_row, theirs_row in zip(seqs, inverse[generated]):
    assert list(ours_row[:10]) == list(theirs_row[:10])


def test_what_cannot_be_imported_is_refused_by_name(spm_models, tmp_path, monkeypatch):
  folder = tmp_path / "opus-mt-de-en"
  _marian_folder(folder, spm_models, encoder_layers=1, decoder_layers=1)
  config = json.loads((folder / "config.json").read_text())
  # A mapping that made a weight of the wrong shape is caught before anything is written.
  hf = hf_marian.read_config(folder)
  options = hf_marian.model_options(hf, folder)
  order, pieces = hf_marian.vocabulary(folder, hf)
  params = hf_marian.convert(hf_marian.read_weights(folder)[1], options, order, folder)
  params["decoder_0"]["feed_forward"]["wo"]["bias"] = np.zeros(3, np.float32)
  with pytest.raises(CheckpointError, match=r"imported weight .*'wo'\]\['bias'\]: shape \(3,\), "
                                            r"the model's \(16,\)"):
    imported_run.write_run(tmp_path / "run", options, ("de", "en"), params,
                     hf_marian.tokenizer_file(folder, pieces), {})
  assert not (tmp_path / "run").exists()

  def refused(change, match):
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=match):
      hf_marian.import_run(folder, tmp_path / "run", "de", "en")

  refused({"layernorm_embedding": True}, "config.json key 'layernorm_embedding' has no equiv")
  refused({"decoder_ffn_dim": 64}, "decoder_ffn_dim=64 differs from encoder_ffn_dim=32")
  refused({"activation_function": "tanh"}, "activation_function='tanh'")
  refused({"model_type": "bart"}, "model_type='bart' \\(only 'marian'\\)")
  (folder / "config.json").write_text(json.dumps(config))
  vocab = json.loads((folder / "vocab.json").read_text())
  (folder / "vocab.json").write_text(json.dumps({**vocab, "▁twice": vocab["<unk>"]}))
  with pytest.raises(CheckpointError, match="vocab.json gives '<unk>' and '▁twice' the same id"):
    hf_marian.import_run(folder, tmp_path / "run", "de", "en")
  (folder / "vocab.json").write_text(json.dumps(vocab))
  # transformers' bookkeeping keys (a config saved again from a loaded model): imported.
  (folder / "config.json").write_text(json.dumps({**config, "_attn_implementation_autoset": 1}))
  hf_marian.import_run(folder, tmp_path / "bookkept", "de", "en")
  (folder / "config.json").write_text(json.dumps(config))
  (folder / "target_vocab.json").write_text("{}")
  with pytest.raises(CheckpointError, match="target_vocab.json \\(separate source and target"):
    hf_marian.import_run(folder, tmp_path / "run", "de", "en")
  (folder / "target_vocab.json").unlink()
  # A PyTorch pickle without torch installed: said so, with the way out.
  (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(CheckpointError, match="needs torch .* or convert it to model.safetensors"):
    hf_marian.import_run(folder, tmp_path / "run", "de", "en")
  assert not (tmp_path / "run").exists()


def test_the_import_tool_writes_a_run_that_translate_takes(spm_models, tmp_path):
  folder = tmp_path / "opus-mt-de-en"
  _marian_folder(folder, spm_models, encoder_layers=1, decoder_layers=1)
  status, out, _ = helpers.run_tool(import_model.main, "--from=hf-marian",
                                    f"--model_dir={folder}", f"--workdir={tmp_path / 'run'}")
  assert status == 0 and "(hf-marian, de->en)" in out  # (the languages: the folder's name)
  record = json.loads((tmp_path / "run" / "import.json").read_text())
  assert record["format"] == "hf-marian" and record["weights"] == "model.safetensors"
  status, out, err = helpers.run_tool(translate.main, f"--workdir={tmp_path / 'run'}",
                                      "--decode=max_length=8", stdin=b"Ein Mann.\n")
  assert status == 0 and len(out.splitlines()) == 1, err
  # A second import into the same folder: refused in one line, the run kept.
  status, _, err = helpers.run_tool(import_model.main, "--from=hf-marian",
                                    f"--model_dir={folder}", f"--workdir={tmp_path / 'run'}")
  assert status == 2 and "exists and is not empty" in err and len(err.splitlines()) == 1
  assert (tmp_path / "run" / "import.json").is_file()


def test_an_imported_model_exported_to_ctranslate2_scores_as_ours(spm_models, tmp_path):
  """import -> export: CTranslate2's log-probabilities of the targets equal ours (PAD, never
  generated, excluded on both sides)."""
  _marian_folder(tmp_path / "opus-mt-de-en", spm_models, encoder_layers=2, decoder_layers=1,
                 tie_word_embeddings=False, scale_embedding=True, activation_function="swish")
  workdir = hf_marian.import_run(tmp_path / "opus-mt-de-en", tmp_path / "run", "de", "en")
  ctranslate2_export.export(workdir, "latest", tmp_path / "ct2")
  assert {"source.spm", "target.spm"} <= {p.name for p in (tmp_path / "ct2").iterdir()}
  assert 'target_sp.decode(' in (tmp_path / "ct2" / "README.md").read_text()
  run = trained_run.load(workdir, dtype="float32")
  params = run.params(run.select_one("latest", "test"))
  tok = run.tokenizer
  x = _padded([tok.encode(s) for s in GERMAN], 0)
  y = _padded([tok.encode(t, "target") for t in ENGLISH], 0)
  logits = run.model.apply({"params": params}, x, y)
  ours = jax.nn.log_softmax(logits.at[..., T.PAD_ID].set(-1e9), axis=-1)
  ours = np.asarray(np.take_along_axis(ours, y[..., None], axis=-1)[..., 0])
  translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
  results = translator.score_batch([tok.encode_pieces(s) for s in GERMAN],
                                   [tok.encode_pieces(t, "target") for t in ENGLISH])
  for row, result in enumerate(results):
    real = int((y[row] > 0).sum())
    np.testing.assert_allclose(result.log_probs, ours[row, :real], atol=1e-4, rtol=0)


def test_an_imported_model_fine_tunes_from_its_own_loss_with_its_tokenizer(
    tiny_tokenizer, tfds_cache, tmp_path):
  """The config the import writes (finetune.py), on the embedded corpus: the run starts at the
  imported weights' validation loss, trains it down, and keeps the imported tokenizer."""
  marian.folder(tmp_path / "opus-mt-de-en", tiny_tokenizer, tiny_tokenizer, encoder_layers=1,
                decoder_layers=1, scale_embedding=True, activation_function="swish")
  source = hf_marian.import_run(tmp_path / "opus-mt-de-en", tmp_path / "imported", "de", "en")
  config = helpers.with_overrides(files.load_file(str(source / "finetune.py")), {
      **marian.TINY_DATA, "data.cache_dir": str(tfds_cache), "optimizer.learning_rate": 1e-3,
      "optimizer.warmup_steps": 5})
  imported = trained_run.load(source, dtype="float32")
  with open_run(from_config_dict(config), tmp_path / "ft", config.to_dict()) as run:
    evaluator = run.evaluators[""]
    start = evaluator.loss(run.state.eval_params)
    assert abs(start - evaluator.loss(imported.params(imported.select_one("latest", "t")))) < 1e-6
    for step in range(1, 21):
      run.train(step)
    assert evaluator.loss(run.state.eval_params) < start - 0.05
  assert (tmp_path / "ft" / "spm.model").read_bytes() == (source / "spm.model").read_bytes()


def test_a_target_multilingual_model_is_imported_with_its_tags_and_asks_for_one(
    spm_models, tmp_path):
  """OPUS-MT's `>>xx<<` tags: recorded at import and said; a leading tag is one piece of the
  vocabulary, as transformers' MarianTokenizer makes it; translating or evaluating without a
  tag is a one-line error, and --source_tag equals the tag written before the line."""
  from transformers import MarianTokenizer  # (the reference: transformers' own splitting)

  folder = tmp_path / "opus-mt-de-roa"
  tags = (">>fra<<", ">>spa<<")
  _marian_folder(folder, spm_models, encoder_layers=1, decoder_layers=1, tags=tags)
  run_dir = tmp_path / "run"
  status, out, err = helpers.run_tool(import_model.main, "--from=hf-marian",
                                      f"--model_dir={folder}", f"--workdir={run_dir}")
  assert status == 0 and "--source_tag=>>fra<<" in err, err
  assert json.loads((run_dir / "import.json").read_text())["target_language_tags"] == list(tags)
  run = trained_run.load(run_dir)
  assert run.tokenizer.language_tags == tags and run.cfg.model.dtype == "float32"
  order, _ = hf_marian.vocabulary(folder, hf_marian.read_config(folder))
  theirs = MarianTokenizer.from_pretrained(folder)(">>spa<< Ein Mann fährt Fahrrad.").input_ids
  ours = run.tokenizer.encode(">>spa<< Ein Mann fährt Fahrrad.")
  assert [order[i] for i in ours] == theirs and ours[0] == run.tokenizer.tag_id(">>spa<<", "")

  def translate_lines(stdin, *flags):
    return helpers.run_tool(translate.main, f"--workdir={run_dir}", "--interactive=false",
                            "--decode=max_length=8", *flags, stdin=stdin)

  status, _, err = translate_lines(b"Ein Mann.\n")
  assert status == 2 and "has no target-language tag" in helpers.one_line_error(err)
  assert "--source_tag=>>fra<<" in err
  status, tagged, _ = translate_lines(b"Ein Mann.\n", "--source_tag=>>spa<<")
  status_inline, inline, _ = translate_lines(b">>spa<< Ein Mann.\n")
  assert status == status_inline == 0 and tagged == inline and tagged.strip()
  (tmp_path / "t.de").write_text("Ein Mann.\n")
  (tmp_path / "t.es").write_text("Un hombre.\n")
  files = [f"--source_file={tmp_path / 't.de'}", f"--reference_file={tmp_path / 't.es'}",
           "--decode=max_length=8", f"--output_dir={tmp_path / 'eval'}"]
  status, _, err = helpers.run_tool(evaluate.main, f"--workdir={run_dir}", *files)
  assert status == 2 and "evaluation set t.de-" in helpers.one_line_error(err)
  status, _, err = helpers.run_tool(evaluate.main, f"--workdir={run_dir}", *files,
                                    "--source_tag=>>spa<<")
  assert status == 0, err
