"""Local parallel-text corpora: the TFDS array_record builder and its input checks."""

import gzip
import logging
import re

import pytest
import tensorflow_datasets as tfds

from transformer_jax.data import corpus
from transformer_jax.errors import DataError


def _write(folder, name, lines, gz=False):
  data = "".join(line + "\n" for line in lines).encode("utf-8")
  path = folder / (name + (".gz" if gz else ""))
  path.write_bytes(gzip.compress(data) if gz else data)
  return path


def _spec(folder, tmp_path, splits=("train",), src="de", tgt="en"):
  return corpus.CorpusSpec("local", str(folder), src, tgt, splits, str(tmp_path / "tfds"))


def test_builder_reads_plain_and_gzipped_files_in_order(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  _write(folder, "train.de", ["eins", "zwei", "drei"], gz=True)
  _write(folder, "train.en", ["one", "two", "three"])
  pairs = list(corpus.iterate_pairs(_spec(folder, tmp_path), "train"))
  assert pairs == [("eins", "one"), ("zwei", "two"), ("drei", "three")]
  # The other direction is a config switch.
  reverse = list(corpus.iterate_pairs(_spec(folder, tmp_path, src="en", tgt="de"), "train"))
  assert reverse == [("one", "eins"), ("two", "zwei"), ("three", "drei")]
  # It is an array_record TFDS dataset, prepared once.
  files = list((tmp_path / "tfds").rglob("*.array_record*"))
  assert files


def test_embedded_multi30k_has_the_published_split_sizes(tmp_path):
  spec = corpus.CorpusSpec("local", "", "de", "en", ("train", "val", "test2016"),
                           str(tmp_path / "tfds"))
  sizes = {split: len(corpus.get_source(spec, split)) for split in spec.splits}
  assert sizes == {"train": 29000, "val": 1014, "test2016": 1000}
  first = next(corpus.iterate_pairs(spec, "test2016"))
  assert first == ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                   "A man in an orange hat starring at something.")


def test_missing_file_names_the_file(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  _write(folder, "train.de", ["a"])
  with pytest.raises(DataError, match=r"missing data file .*train\.en"):
    list(corpus.iterate_pairs(_spec(folder, tmp_path), "train"))


def test_missing_folder_is_named(tmp_path):
  with pytest.raises(DataError, match="does not exist"):
    list(corpus.iterate_pairs(_spec(tmp_path / "nowhere", tmp_path), "train"))


def test_different_line_counts_name_both_files_and_counts(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  _write(folder, "train.de", ["a", "b", "c"])
  _write(folder, "train.en", ["x", "y"])
  with pytest.raises(DataError,
                     match=r"different line counts: .*train\.de has 3 lines, .*train\.en has 2"):
    list(corpus.read_parallel(folder, "train", ("de", "en")))
  with pytest.raises(DataError, match="different line counts"):
    corpus.get_source(_spec(folder, tmp_path), "train")


def test_invalid_utf8_names_file_and_line(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  _write(folder, "train.en", ["ok", "fine", "good"])
  (folder / "train.de").write_bytes(b"gut\nnoch gut\nkaputt \xff\xfe\n")
  with pytest.raises(DataError, match=r"train\.de:3: not valid UTF-8"):
    list(corpus.read_parallel(folder, "train", ("de", "en")))


def test_preparation_streams_into_shards_once(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus, "PAIRS_PER_SHARD", 2)
  folder = tmp_path / "corpus"
  folder.mkdir()
  _write(folder, "train.de", [f"d{i}" for i in range(5)])
  _write(folder, "train.en", [f"e{i}" for i in range(5)])
  spec = _spec(folder, tmp_path)
  # A preparation interrupted earlier left a half-written folder: it is cleared, then redone.
  stale = tmp_path / "tfds" / "parallel_text" / "de-en_x" / ".incomplete-1"
  stale.mkdir(parents=True)
  assert list(corpus.iterate_pairs(spec, "train")) == [(f"d{i}", f"e{i}") for i in range(5)]
  prepared = sorted(p.name for p in (tmp_path / "tfds").rglob("*.array_record-*"))
  assert prepared == [f"parallel_text-train.array_record-0000{i}-of-00003" for i in range(3)]
  assert corpus.get_builder(spec).info.splits["train"].shard_lengths == [2, 2, 1]
  # Prepared once: a second read does not write again.
  before = {p: p.stat().st_mtime_ns for p in (tmp_path / "tfds").rglob("*.array_record-*")}
  assert len(corpus.get_source(spec, "train")) == 5
  assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "tfds").rglob("*array_record-*")}


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_prepared_corpus_is_prepared_again(tmp_path, caplog, damage):
  folder = tmp_path / "corpus"
  folder.mkdir()
  words = [f"satz {i}" for i in range(50)]
  _write(folder, "train.de", words)
  _write(folder, "train.en", [w.replace("satz", "sentence") for w in words])
  spec = _spec(folder, tmp_path)
  assert len(list(corpus.iterate_pairs(spec, "train"))) == 50
  (shard,) = (tmp_path / "tfds").rglob("*train.array_record*")
  if damage == "truncate":
    shard.write_bytes(shard.read_bytes()[:1000])
  else:
    shard.unlink()
  with caplog.at_level(logging.WARNING, logger="transformer_jax"):
    pairs = list(corpus.iterate_pairs(spec, "train"))
  assert pairs[7] == ("satz 7", "sentence 7") and len(pairs) == 50
  assert f"prepared corpus {shard.parent} is damaged" in caplog.text
  # (array_record: a truncated shard reads as fewer records, or fails below 64 KB)
  assert re.search(r"\.array_record-00000-of-00001 (holds \d+ records, 50 recorded|unreadable: )"
                   if damage == "truncate" else "missing", caplog.text)


class DamageTestCorpus(tfds.core.GeneratorBasedBuilder):
  """A TFDS dataset built by TFDS's own writer (as the WMT builders are), 40 pairs."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(
        {"de": tfds.features.Text(), "en": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for i in range(40):
      yield i, {"de": f"satz {i}", "en": f"sentence {i}"}


def test_a_damaged_tfds_prepared_dataset_is_a_one_line_error_naming_it(tmp_path):
  spec = corpus.CorpusSpec("damage_test_corpus", "", "de", "en", ("train",),
                           str(tmp_path / "tfds"))
  assert len(list(corpus.iterate_pairs(spec, "train"))) == 40
  (shard,) = (tmp_path / "tfds").rglob("*train.array_record*")
  shard.write_bytes(shard.read_bytes()[:100])
  with pytest.raises(DataError, match=rf"^prepared dataset {shard.parent} is damaged \(split "
                                      r"'train': .*(holds \d+ records, 40 recorded|"
                                      r"unreadable: .*)\); remove that folder and rerun"):
    corpus.get_builder(spec)


def test_wrong_layouts_point_at_split_corpus(tmp_path):
  file = _write(tmp_path, "pairs.tsv", ["a\tb"])
  with pytest.raises(DataError, match=r"data folder .*pairs.tsv is a file, not a folder .*"
                                      "transformer-jax-split-corpus"):
    list(corpus.iterate_pairs(_spec(file, tmp_path), "train"))
  tsv = tmp_path / "tsv"
  tsv.mkdir()
  for lang in ("de", "en"):  # (tab-separated pairs saved under both names)
    _write(tsv, f"train.{lang}", [f"satz {i}\tsentence {i}" for i in range(120)])
  with pytest.raises(DataError, match=r"first 100 lines holds a tab: tab-separated pairs\? "
                                      ".*transformer-jax-split-corpus"):
    list(corpus.iterate_pairs(_spec(tsv, tmp_path), "train"))
  same = tmp_path / "same"
  same.mkdir()
  for lang in ("de", "en"):
    _write(same, f"train.{lang}", [f"satz {i}" for i in range(120)])
  with pytest.raises(DataError, match="first 100 lines are identical"):
    list(corpus.iterate_pairs(_spec(same, tmp_path), "train"))
  assert not list((tmp_path / "tfds").rglob(".incomplete-*"))  # (nothing half-written left)
