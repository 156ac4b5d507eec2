"""The paper configs' TFDS WMT path, offline: TFDS mock data stands in for WMT'17/'14.

TFDS's WMT builders import TensorFlow, the optional `wmt` extra that the test environment
installs (`make test`); the default, local-corpus path must not import it.
"""

import json

import tensorflow_datasets as tfds

from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import wmt_base, wmt_big
from transformer_jax.data import corpus
from transformer_jax.training.loop import train_and_evaluate


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
  c = _mock_sized(wmt_base.get_config, tmp_path)
  workdir = tmp_path / "run"
  with tfds.testing.mock_data(num_examples=64):
    train_and_evaluate(from_config_dict(c), workdir, c.to_dict())
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  # The 48-piece SentencePiece was trained on the character sample of the mock pairs.
  assert (workdir / "spm.model").is_file()
  assert [r["step"] for r in records if "test/bleu" in r] == [4]
  result, = json.loads((workdir / "eval" / "test" / "results.json").read_text())
  assert (result["data"], result["steps"]) == ("test", [4]) and 0 <= result["bleu"] <= 100
  assert result["bleu"] == [r["test/bleu"] for r in records if "test/bleu" in r][0]
  hyps = (workdir / "eval" / "test" / "step_4.hyp").read_text().splitlines()
  assert len(hyps) == 64  # every newstest2014 (mock) sentence decoded


def _spec(c):
  return corpus.corpus_spec(from_config_dict(c).data)


def test_both_directions_read_the_same_mock_pairs_swapped(tmp_path):
  with tfds.testing.mock_data(num_examples=5):
    source = tfds.data_source("wmt14_translate/de-en", split="train")
    assert len(source) == 5 and set(source[0]) == {"de", "en"}
    ende = list(corpus.iterate_pairs(_spec(_mock_sized(wmt_big.get_config, tmp_path)), "train"))
    deen = list(corpus.iterate_pairs(_spec(_mock_sized(
        wmt_big.get_config, tmp_path, source_lang="de", target_lang="en")), "train"))
  assert len(ende) == 5 and deen == [(b, a) for a, b in ende]
  assert all(a != b for a, b in ende)
