"""The paper configs' TFDS WMT path, offline: TFDS mock data stands in for WMT'17/'14.

TFDS's WMT builders import TensorFlow, the optional `wmt` extra that the test environment
installs (`make test`); the default, local-corpus path must not import it.
"""

import json
import subprocess
import sys

import pytest

from configs import wmt_base, wmt_big
from tests.conftest import ROOT
from transformer_jax import config as config_lib
from transformer_jax import corpus, train_lib


def _paper_sizes(cfg):
  m = cfg.model
  return (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.num_heads, m.d_ff,
          m.dropout_rate, m.pre_layer_norm)


def test_paper_configs_have_the_paper_sizes_data_and_batch():
  base = config_lib.from_config_dict(wmt_base.get_config())
  big = config_lib.from_config_dict(wmt_big.get_config())
  assert _paper_sizes(base) == (6, 6, 512, 8, 2048, 0.1, False)
  assert _paper_sizes(big) == (6, 6, 1024, 16, 4096, 0.3, False)
  for cfg in (base, big):
    assert cfg.model.vocab_size == 32000 and cfg.data.tokenizer_max_chars == 10_000_000
    assert (cfg.data.dataset, cfg.data.train_split) == ("wmt17_translate/de-en", "train")
    # newstest2014 is the test split of TFDS's wmt14 (wmt17's is newstest2017).
    assert (cfg.data.test_dataset, cfg.data.test_split) == ("wmt14_translate/de-en", "test")
    assert (cfg.data.source_lang, cfg.data.target_lang) == ("en", "de")
    # ~25k source and ~25k target tokens: 256 packed rows of 128 slots per side.
    assert cfg.data.batch_size * cfg.data.max_source_length == 32768
  # 4000 warmup steps to d_model^-0.5 * 4000^-0.5.
  assert base.optimizer.learning_rate == pytest.approx(512**-0.5 * 4000**-0.5, rel=0.01)
  assert big.optimizer.learning_rate == pytest.approx(1024**-0.5 * 4000**-0.5, rel=0.01)


def _mock_sized(get_config, tmp_path, **data_overrides):
  """A paper config with its data path intact and a model small enough for a CPU test."""
  c = get_config()
  c.num_train_steps = 4
  c.log_every_steps = c.eval_every_steps = c.checkpoint_every_steps = 2
  c.eval_max_sentences = 8
  c.model.update(vocab_size=48, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1,
                 num_decoder_layers=1, dtype="float32")
  c.data.update(cache_dir=str(tmp_path / "tfds"), tokenizer_max_chars=20_000,
                max_source_length=32, max_target_length=32, batch_size=4, num_threads=1,
                **data_overrides)
  c.decode.update(batch_size=8, max_length=16, beam_size=2)
  return c


def test_wmt_base_trains_and_decodes_on_mock_wmt(tmp_path):
  import tensorflow_datasets as tfds
  c = _mock_sized(wmt_base.get_config, tmp_path)
  workdir = tmp_path / "run"
  with tfds.testing.mock_data(num_examples=64):
    train_lib.train_and_evaluate(config_lib.from_config_dict(c), workdir, c.to_dict())
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  # The 48-piece SentencePiece was trained on the character sample of the mock pairs.
  assert (workdir / "spm.model").is_file()
  assert [r["step"] for r in records if "test/bleu" in r] == [4]
  result = json.loads((workdir / "test_results.json").read_text())
  assert (result["split"], result["step"]) == ("test", 4) and 0 <= result["bleu"] <= 100
  hyps = (workdir / "test.hyp.de").read_text().splitlines()
  assert len(hyps) == 64  # every newstest2014 (mock) sentence decoded


def _spec(c):
  return config_lib.from_config_dict(c).data.corpus_spec()


def test_both_directions_read_the_same_mock_pairs_swapped(tmp_path):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=5):
    source = tfds.data_source("wmt14_translate/de-en", split="train")
    assert len(source) == 5 and set(source[0]) == {"de", "en"}
    ende = list(corpus.iterate_pairs(_spec(_mock_sized(wmt_big.get_config, tmp_path)), "train"))
    deen = list(corpus.iterate_pairs(_spec(_mock_sized(
        wmt_big.get_config, tmp_path, source_lang="de", target_lang="en")), "train"))
  assert len(ende) == 5 and deen == [(b, a) for a, b in ende]
  assert all(a != b for a, b in ende)


def test_the_default_path_does_not_import_tensorflow(tmp_path):
  code = ("import sys; from transformer_jax import train_lib, evaluate, translate, corpus;"
          "from configs import default;"
          "spec = corpus.CorpusSpec('local', '', 'de', 'en', ('val',), sys.argv[1]);"
          "assert len(corpus.get_source(spec, 'val')) == 1014;"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
  r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tfds")], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]"
