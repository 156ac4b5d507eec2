"""Preparing a local corpus with Apache Beam pipelines (DirectRunner, two worker processes):
the same shards, byte for byte, and the same cleaning report as the single-process
preparation, the same token-id store; and the command-line path that a cluster run takes."""

import gzip
import json
import random
import shutil

import pytest

from tests import helpers
from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.data import cleaning, corpus, tokenized
from transformer_jax.data.apache_beam_graph import line_shards, read_shard
from transformer_jax.data.apache_beam_prep import beam_tokenizer, beam_writer
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import DataError

RULES = CleaningConfig(empty=True, max_words=20, max_length_ratio=2.5, identical=True,
                       duplicates=True, min_letter_fraction=0.5, examples=3)


# Two worker processes: the shards must not depend on which process wrote a pair (protobuf's
# map order does, unless serialized deterministically).
WORKERS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def _corpus(folder, n=2600, gz=False):
  """n pairs of Multi30k with crafted breakers of each rule sprinkled in, duplicates included."""
  rng = random.Random(0)
  base = list(zip(corpus.read_lines(corpus.EMBEDDED_MULTI30K / "train.de.gz"),
                  corpus.read_lines(corpus.EMBEDDED_MULTI30K / "train.en.gz")))[:n]
  pairs = []
  for i, pair in enumerate(base):
    pairs.append(pair)
    if i % 97 == 0:
      pairs.append(rng.choice([("", "empty"), ("x " * 30, "x " * 30), ("Bild", "Bild"),
                               ("1 2 3 4", "5 6 7 8"), ("ein kurzer satz", "a " * 12),
                               pairs[rng.randrange(len(pairs))]]))
  folder.mkdir()
  for side, lang in enumerate(("de", "en")):
    for split, part in (("train", pairs), ("val", base[:30])):
      data = "".join(p[side].strip() + "\n" for p in part).encode()
      path = folder / (f"{split}.{lang}" + (".gz" if gz else ""))
      path.write_bytes(gzip.compress(data) if gz else data)
  return pairs


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
def test_input_shards_read_back_every_line_once(tmp_path, gz):
  """Gzipped files too are split into line ranges (through plain copies unpacked in the same
  pass), so no worker holds more than a shard of the corpus."""
  pairs = _corpus(tmp_path / "c", gz=gz)
  suffix = ".gz" if gz else ""
  (tmp_path / "unpacked").mkdir()
  shards = line_shards(tmp_path / "c" / f"train.de{suffix}", tmp_path / "c" / f"train.en{suffix}",
                       500, tmp_path / "unpacked")
  assert len(shards) == -(-len(pairs) // 500) > 1
  assert max(s.count for s in shards) == 500
  read = [t for s in shards for t in read_shard(s)]
  assert read == list(corpus.read_parallel(tmp_path / "c", "train", ("de", "en")))
  assert len(list((tmp_path / "unpacked").iterdir())) == (2 if gz else 0)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
def test_the_beam_preparation_writes_the_same_shards_and_report_as_one_process(tmp_path, gz,
                                                                              monkeypatch):
  monkeypatch.setattr(corpus, "PAIRS_PER_SHARD", 1000)  # (several output shards)
  _corpus(tmp_path / "c", gz=gz)
  args = (tmp_path / "c", ("train", "val"), ("de", "en"))
  one = corpus.prepare_local(*args, str(tmp_path / "one"), RULES, "train")
  beam = corpus.prepare_local(*args, str(tmp_path / "beam"), RULES, "train",
                              beam_writer("DirectRunner", WORKERS, lines_per_shard=700))
  one_report, = json.loads((one / cleaning.REPORT).read_text())
  beam_report, = json.loads((beam / cleaning.REPORT).read_text())
  assert beam_report == one_report
  assert set(one_report["dropped"]) == set(RULES.active) and all(
      one_report["dropped"].values())  # (every rule dropped something)
  shards = sorted(p.name for p in one.glob("parallel_text-*"))
  assert len([s for s in shards if "-train." in s]) == 3
  assert sorted(p.name for p in beam.glob("parallel_text-*")) == shards
  for name in shards:
    assert (beam / name).read_bytes() == (one / name).read_bytes(), name
  one_info, beam_info = (json.loads((d / "dataset_info.json").read_text())["splits"]
                         for d in (one, beam))
  assert beam_info == one_info


def test_prepare_data_with_a_beam_runner_then_one_process_finds_it_prepared(tmp_path):
  _corpus(tmp_path / "c", n=800)
  from transformer_jax.cli import prepare_data
  flags = [f"--config.data.{k}={v}" for k, v in (
      ("data_dir", tmp_path / "c"), ("cache_dir", tmp_path / "cache"), ("eval_split", "val"),
      ("cleaning.duplicates", True), ("cleaning.identical", True))]
  status, out, err = helpers.run_tool(
      prepare_data.main, "--config=configs/tiny.py", *flags, f"--workdir={tmp_path / 'run'}",
      "--beam_runner=DirectRunner", "--beam_option=--direct_num_workers=1")
  assert status == 0, err
  prepared, = (tmp_path / "cache" / "parallel_text").glob("de-en_*_clean*/1.0.0")
  report, = json.loads((prepared / cleaning.REPORT).read_text())
  assert report["dropped"]["duplicates"] > 0 and report["dropped"]["identical"] > 0
  assert f":train: {report['pairs_kept']:,} pairs" in out
  # a second preparation (in one process) finds it prepared: the same folder, untouched
  before = {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()}
  status, out, _ = helpers.run_tool(prepare_data.main, "--config=configs/tiny.py", *flags,
                                    f"--workdir={tmp_path / 'run'}")
  assert status == 0 and {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()} == before


def test_tokenizing_with_beam_writes_the_same_id_store(tmp_path):
  _corpus(tmp_path / "c", n=1500)
  cfg = helpers.section("data", data_dir=str(tmp_path / "c"), eval_split="val", test_split="",
                        cache_dir=str(tmp_path / "cache"))
  spec = corpus.corpus_spec(cfg)
  tok = train_tokenizer((s for pair in corpus.iterate_pairs(spec, "train") for s in pair), 300,
                        tmp_path / "spm.model")
  one = tokenized.tokenized_split(spec, tok)
  folder = one.folder
  shutil.move(folder, tmp_path / "one")  # (the next call writes it again, with Beam)
  beam = tokenized.tokenized_split(spec, tok, write_ids=beam_tokenizer(
      "DirectRunner", WORKERS, pairs_per_task=400))
  assert beam.folder == folder and beam.num_pairs == one.num_pairs > 1500
  for name in ("source.ids", "source.offsets", "target.ids", "target.offsets", "meta.json"):
    assert (folder / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
  assert not list(folder.glob("*.0000*"))  # (the part files are gone)


def test_a_non_utf8_line_in_a_later_shard_is_named_by_its_file_and_line(tmp_path):
  pairs = _corpus(tmp_path / "c", n=1200)
  path = tmp_path / "c" / "train.de"
  lines = path.read_bytes().split(b"\n")
  lines[1102] = b"\xff\xfe kaputt"  # (line 1103, in the third input shard of 500)
  path.write_bytes(b"\n".join(lines))
  shards = line_shards(path, tmp_path / "c" / "train.en", 500)
  assert len(pairs) > 1103 and len(shards) >= 3
  with pytest.raises(DataError, match=rf"{path}:1103: not valid UTF-8"):
    list(read_shard(shards[2]))
