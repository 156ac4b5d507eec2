"""Cleaning rules at preparation: each drops exactly the crafted pairs that break it, counts
them (first rule broken, in order), keeps examples, and reports beside the prepared data."""

import dataclasses
import json

import pytest
import tensorflow_datasets as tfds

from tests import helpers
from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.data import cleaning, corpus
from transformer_jax.errors import ConfigError

GOOD = [("ein hund rennt", "a dog runs"), ("zwei katzen schlafen", "two cats sleep"),
        ("eine frau liest ein buch", "a woman reads a book")]
# Each breaks exactly one rule (with the settings of ALL below), and says which.
BAD = [("", "an empty source", "empty"),
       ("eins zwei drei vier fünf sechs sieben acht neun zehn elf", "too long",
        "max_length_ratio"),
       (" ".join(["wort"] * 13), " ".join(["word"] * 13), "max_words"),
       ("Flickr", "Flickr", "identical"),
       ("ein hund rennt", "a dog runs", "duplicates"),
       ("12345 678 90", "12345 678 90 !", "min_letter_fraction")]
ALL = CleaningConfig(empty=True, max_words=12, max_length_ratio=3.0, identical=True,
                     duplicates=True, min_letter_fraction=0.5, examples=2)


def _folder(tmp_path, pairs):
  folder = tmp_path / "corpus"
  folder.mkdir()
  for side, lang in enumerate(("de", "en")):
    (folder / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    (folder / f"val.{lang}").write_text("".join(p[side] + "\n" for p in GOOD))
  return folder


def _prepared_pairs(out, split="train"):
  source = tfds.builder_from_directory(str(out)).as_data_source(split=split)
  return [(corpus.as_text(ex["de"]), corpus.as_text(ex["en"])) for ex in source], split


# What each rule alone drops of GOOD + BAD: its own pair, and for the letter rule also the
# empty source (no letters at all); the duplicate rule drops the second occurrence only.
ALONE = {rule: [i for i, (_, _, r) in enumerate(BAD) if r == rule] for rule in ALL.RULES}
ALONE["min_letter_fraction"] = [0, 5]


@pytest.mark.parametrize("rule", CleaningConfig.RULES)
def test_each_rule_alone_drops_exactly_the_pairs_that_break_it(tmp_path, rule):
  pairs = GOOD + [(a, b) for a, b, _ in BAD]
  on = {rule: getattr(ALL, rule)}
  out = corpus.prepare_local(_folder(tmp_path, pairs), ("train", "val"), ("de", "en"),
                             str(tmp_path / "cache"), CleaningConfig(**on), "train")
  kept, _ = _prepared_pairs(out)
  dropped = [len(GOOD) + i for i in ALONE[rule]]
  assert kept == [p for i, p in enumerate(pairs) if i not in dropped]  # (in file order)
  report, = json.loads((out / cleaning.REPORT).read_text())
  assert report["dropped"] == {rule: len(dropped)} and report["rules"] == on
  assert report["pairs_read"] == len(pairs) and report["pairs_kept"] == len(kept)
  assert [e[0] for e in report["examples"][rule]] == [i + 1 for i in dropped][:ALL.examples]
  val, _ = _prepared_pairs(out, "val")
  assert val == GOOD  # (only the training split is cleaned)


def test_all_rules_count_each_pair_under_the_first_it_breaks_with_examples(tmp_path, caplog):
  pairs = GOOD + [(a, b) for a, b, _ in BAD]
  caplog.set_level("INFO")
  out = corpus.prepare_local(_folder(tmp_path, pairs), ("train",), ("de", "en"),
                             str(tmp_path / "cache"), ALL, "train")
  kept, _ = _prepared_pairs(out)
  assert kept == GOOD
  report, = json.loads((out / cleaning.REPORT).read_text())
  assert report["dropped"] == {r: 1 for r in CleaningConfig.RULES}
  line_of = {rule: len(GOOD) + 1 + i for i, (_, _, rule) in enumerate(BAD)}
  for a, b, rule in BAD:
    assert report["examples"][rule] == [[line_of[rule], a, b]]
  assert "6 kept" not in caplog.text and "9 pairs read, 3 kept" in caplog.text
  assert "line 5: 'eins zwei drei" in caplog.text  # (examples printed, with their lines)


def test_no_rule_leaves_the_corpus_and_its_cache_name_as_before(tmp_path):
  folder = _folder(tmp_path, GOOD + GOOD)
  plain = corpus.prepare_local(folder, ("train",), ("de", "en"), str(tmp_path / "c"))
  off = corpus.prepare_local(folder, ("train",), ("de", "en"), str(tmp_path / "c"),
                             CleaningConfig(), "train")
  dedup = corpus.prepare_local(folder, ("train",), ("de", "en"), str(tmp_path / "c"),
                               CleaningConfig(duplicates=True), "train")
  assert off == plain and dedup != plain and not (plain / cleaning.REPORT).exists()
  assert len(_prepared_pairs(plain)[0]) == 6 and _prepared_pairs(dedup)[0] == GOOD


def test_cleaning_through_the_config_and_its_errors(tmp_path):
  cfg, _ = helpers.small_corpus(tmp_path)
  cfg = dataclasses.replace(cfg, cleaning=CleaningConfig(max_words=3))
  spec = corpus.corpus_spec(cfg)
  pairs = list(corpus.iterate_pairs(spec, "train"))
  assert pairs == [(s, t) for s, t in zip(helpers.SRC, helpers.TGT)
                   if max(len(s.split()), len(t.split())) <= 3]
  assert len(list(corpus.iterate_pairs(spec, "val"))) == len(helpers.SRC)
  with pytest.raises(ConfigError, match="cleaning.max_length_ratio=0.5 must be >= 1"):
    helpers.tiny_train_config(**{"data.cleaning.max_length_ratio": 0.5})
  with pytest.raises(ConfigError, match="applies to local corpora, not to the TFDS dataset"):
    corpus.get_builder(dataclasses.replace(spec, dataset="wmt14_translate/de-en"))
