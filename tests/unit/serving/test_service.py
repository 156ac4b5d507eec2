"""The server's engine: each sentence's n-best and what its client is told of it."""

import dataclasses
import types

import pytest

from tests import helpers
from transformer_jax.config import fields
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.batches import Hypothesis
from transformer_jax.errors import ConfigError
from transformer_jax.inference.translator import Translator
from transformer_jax.serving.service import Options, Service, Translated


class Stub:
  """A translator of the tiny config with the tiny tokenizer: each sentence's n-best is a
  finished hypothesis and, from a sentence with "cut" in it, one its cap stopped (ids as
  many as the cap)."""
  alignment_layer, source_prefix = None, []

  def __init__(self, tokenizer_path, engine="jax"):
    cfg = helpers.tiny_train_config()
    # (as an ensemble whose shortest member reads 64 positions: the first run's config says 256)
    self.decode, self.max_len = cfg.decode, 64
    self.engine = types.SimpleNamespace(
        name=engine, seeds_each_call=True, max_len=64,
        check=lambda decode: fields.check_honoured(decode, engine, "decode"))
    self.run = types.SimpleNamespace(cfg=cfg, tokenizer=Tokenizer.load(tokenizer_path))

  def translate(self, sentences, prefixes=None, seed=None, decode=None):
    return [[Hypothesis("done", -1.0, (5, 6)),
             *([Hypothesis("cut", -2.0, (5,) * 9, ended=False)] if "cut" in s else [])]
            for s in sentences]


def test_a_source_past_the_models_positions_and_a_capped_translation_are_noted(tiny_tokenizer):
  engine = Service(Stub(tiny_tokenizer))
  long = "Ein Hund läuft durch den Schnee. " * 12  # (over 64 subwords, under 256)
  length = len(engine.tokenizer.encode(long))
  assert 64 < length < 256
  answers = engine.translate(["Ein Hund.", long, "cut here"], ["", "", ""], Options())
  assert answers == [
      Translated([{"translation": "done", "score": -1.0}], []),
      Translated([{"translation": "done", "score": -1.0}],
                 [f"its {length} subwords are more than the model reads (64): translated "
                  "from the first 64"]),
      Translated([{"translation": "done", "score": -1.0}, {"translation": "cut", "score": -2.0}],
                 ["hypothesis 2 of its 2 stopped at the length cap of 9 subwords, unfinished"])]


def test_an_option_the_engine_cannot_honour_is_refused_naming_option_and_engine(tiny_tokenizer,
                                                                             monkeypatch):
  """(as the options' declarations say; here our search declared without no_repeat_ngram_size,
  CTranslate2 with it)"""
  declared = fields.options(DecodeConfig)
  monkeypatch.setattr(fields, "options", lambda cls: {**declared, "no_repeat_ngram_size": (
      dataclasses.replace(declared["no_repeat_ngram_size"], search=False))})
  ours, request = Service(Stub(tiny_tokenizer)), Options((("no_repeat_ngram_size", 3),))
  with pytest.raises(ConfigError, match=r"^decode\.no_repeat_ngram_size=3: the jax engine "
                                        r"cannot honour it \(leave it at 0, or use "
                                        r"--engine=ctranslate2\)$"):
    ours.decode_config(request)
  theirs = Stub(tiny_tokenizer, "ctranslate2")
  assert Service(theirs).decode_config(request).no_repeat_ngram_size == 3


def test_a_sentence_samples_the_same_alone_and_beside_others(tiny_run):
  """A sentence's sample depends on its seed and its own text, not on its neighbours: sampled
  alone, or beside others in one request or one batch of the server's, it is the same."""
  engine = Service(Translator(str(tiny_run), decode_overrides=["sampling=true"]))
  target = "Eine Frau spielt Gitarre."
  others = ["Ein Hund läuft durch den Schnee.", "Zwei Männer.", "Ein Kind lacht."]

  def sample(sentences, seed=None):
    answers = engine.translate(sentences, [""] * len(sentences), Options(seed=seed))
    return answers[sentences.index(target)].hypotheses[0]["translation"]

  for seed in (None, 7):  # (unseeded: the run's decode.seed)
    alone = sample([target], seed)
    assert sample([*others, target], seed) == alone
    assert sample([others[0], target, *others[1:]], seed) == alone
  assert len({sample([target], s) for s in (1, 2, 3, 4)}) > 1  # (the seed does change it)
