"""split_corpus: a leak-free train/dev/test folder from pairs without a split."""

import gzip
import json

import pytest

from transformer_jax.data import corpus
from transformer_jax.data.splitting import in_dev, split_corpus
from transformer_jax.data.text import read_lines
from transformer_jax.errors import DataError


def _gz(path, lines):
  path.write_bytes(gzip.compress("".join(f"{line}\n" for line in lines).encode("utf-8")))
  return path


def _read(folder, split, lang):
  return list(read_lines(folder / f"{split}.{lang}.gz"))


def test_split_by_english_sentence_without_test_overlap(tmp_path):
  # 300 English sentences, each with two German translations (as in Tatoeba).
  pairs = [f"sentence {i}.\tSatz {i}.\tSatz Nummer {i}." for i in range(300)]
  tsv = _gz(tmp_path / "pairs.tsv.gz",
            [line for p in pairs for line in (p.split("\t")[0] + "\t" + p.split("\t")[1],
                                              p.split("\t")[0] + "\t" + p.split("\t")[2])])
  # The test set shares an English side with pair 7 and a German side with pair 8; it holds
  # two references for one German sentence (deduplicated) and a sentence of its own.
  test = {"de": _gz(tmp_path / "t.deu.gz", ["Satz 8.", "Neu.", "Neu."]),
          "en": _gz(tmp_path / "t.eng.gz", ["sentence 7.", "New.", "New one."])}
  exclude = _gz(tmp_path / "old.eng.gz", ["sentence 9."])
  out = tmp_path / "split"
  report = split_corpus([tsv], ["en", "de"], out, group_by="en", dev_fraction=0.2, test=test,
                        dedup_test_by="de", exclude=[exclude])

  train = list(zip(_read(out, "train", "en"), _read(out, "train", "de")))
  dev = list(zip(_read(out, "dev", "en"), _read(out, "dev", "de")))
  # Every pair of sentence 7 (English in test), 8's "Satz 8." (German in test) and 9 is gone;
  # 8's other translation stays.
  removed = {("sentence 7.", "Satz 7."), ("sentence 7.", "Satz Nummer 7."),
             ("sentence 8.", "Satz 8."), ("sentence 9.", "Satz 9."),
             ("sentence 9.", "Satz Nummer 9.")}
  assert not removed & set(train + dev)
  assert len(train) + len(dev) == 600 - 5
  # Both translations of a sentence are on the same side of the split.
  assert not {en for en, _ in train} & {en for en, _ in dev}
  assert 0.12 < len(dev) / 595 < 0.28
  # The test set: one reference per German source, in file order.
  assert _read(out, "test", "de") == ["Satz 8.", "Neu."]
  assert _read(out, "test", "en") == ["sentence 7.", "New."]
  counts = report["counts"]
  assert counts == json.loads((out / "split.json").read_text())["counts"]
  assert (counts["read"], counts["removed_in_test"], counts["test_read"], counts["test"]) == \
      (600, 5, 3, 2)
  assert counts["train"] == len(train) and counts["dev"] == len(dev)
  # The folder is a local corpus: the same pairs through the TFDS array_record path.
  spec = corpus.CorpusSpec("local", str(out), "de", "en", ("train", "dev", "test"),
                           str(tmp_path / "tfds"))
  assert list(corpus.iterate_pairs(spec, "test")) == [("Satz 8.", "sentence 7."),
                                                      ("Neu.", "New.")]


def test_dev_membership_is_a_stable_fraction():
  sentences = [f"s{i}" for i in range(20000)]
  share = sum(in_dev(s, 0.05, seed=0) for s in sentences) / len(sentences)
  assert 0.045 < share < 0.055
  assert [in_dev(s, 0.05, 0) for s in sentences[:500]] == \
      [in_dev(s, 0.05, 0) for s in sentences[:500]]
  assert [in_dev(s, 0.05, 1) for s in sentences] != [in_dev(s, 0.05, 0) for s in sentences]


def test_bad_input_is_named(tmp_path):
  bad = _gz(tmp_path / "bad.tsv.gz", ["a\tb", "only one field", "c\td"])
  with pytest.raises(DataError, match=r"bad\.tsv\.gz:2: 1 tab-separated fields"):
    split_corpus([bad], ["en", "de"], tmp_path / "out")
  assert not list((tmp_path / "out").glob("*.gz"))  # nothing half-written is left
  good = _gz(tmp_path / "good.tsv.gz", ["a\tb"])
  test = {"de": _gz(tmp_path / "t.de.gz", ["x", "y"]), "en": _gz(tmp_path / "t.en.gz", ["x"])}
  with pytest.raises(DataError,
                     match=r"different line counts: .*t\.en\.gz has 1 lines, .*t\.de\.gz has 2"):
    split_corpus([good], ["en", "de"], tmp_path / "out", test=test)
  with pytest.raises(ValueError, match="--group_by=fr"):
    split_corpus([good], ["en", "de"], tmp_path / "out", group_by="fr")
