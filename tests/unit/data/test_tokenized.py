"""The tokenized store: the ids Tokenizer.encode gives, written once per corpus + tokenizer,
O(1) reads, filter codes and counts, clear errors on damage."""

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from tests import helpers
from tests.helpers import SRC, TGT
from transformer_jax.data import corpus, tokenized
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import DataError


@pytest.fixture()
def setup(tmp_path):
  return helpers.small_corpus(tmp_path)


def test_the_store_holds_the_ids_of_every_pair_in_corpus_order(setup):
  cfg, tok = setup
  store = tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  assert store.num_pairs == len(SRC) and store.id_dtype == "uint16"
  order = np.asarray([5, 0, 7, 2])
  for side, texts in (("source", SRC), ("target", TGT)):
    starts, ends = store.bounds(side, order)
    ids = store.read_ids(side, starts, ends)
    expected = [tok.encode(texts[i]) for i in order]
    assert (ends - starts).tolist() == [len(e) for e in expected]
    assert ids.dtype == np.int32 and ids.tolist() == [t for e in expected for t in e]


def test_written_once_per_corpus_and_tokenizer(setup, tmp_path):
  cfg, tok = setup
  first = tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  stamp = os.stat(first.folder / "source.ids").st_mtime_ns
  again = tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  assert again.folder == first.folder and os.stat(again.folder / "source.ids").st_mtime_ns == stamp
  other = train_tokenizer(SRC + TGT, 60, tmp_path / "other.model")
  assert tokenized.tokenized_split(corpus.corpus_spec(cfg), other).folder != first.folder
  assert not list(first.folder.parent.glob(".incomplete-*"))


def test_a_damaged_store_is_a_one_line_error(setup):
  cfg, tok = setup
  store = tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  with open(store.folder / "target.offsets", "r+b") as f:
    f.truncate(16)
  with pytest.raises(DataError, match=r"tokenized data in .* is damaged .*target.offsets.*"
                                      "delete the folder"):
    tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)


def test_filter_codes_and_shard_counts(setup):
  cfg, tok = setup
  cfg = dataclasses.replace(cfg, max_source_length=8, max_target_length=9)
  codes = tokenized.filter_codes(np.array([1, 3, 9, 8, 2]), np.array([5, 1, 2, 9, 10]), cfg)
  assert codes.tolist() == [tokenized.EMPTY, tokenized.EMPTY, tokenized.TOO_LONG,
                            tokenized.KEEP, tokenized.TOO_LONG]
  store = tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  all_codes = tokenized.filter_codes(store.lengths("source"), store.lengths("target"), cfg)
  for shard in (slice(None), slice(0, None, 2), slice(1, None, 3)):
    for block in (3, 1 << 20):  # (blocks that cut the shard's stride, and one block)
      counts = tokenized.count_codes(store, cfg, shard, block=block)
      assert counts.tolist() == np.bincount(all_codes[shard], minlength=3).tolist()


def test_a_failed_write_leaves_no_half_written_store(setup, monkeypatch):
  cfg, tok = setup
  monkeypatch.setattr(tok, "encode_batch", lambda texts, side: (_ for _ in ()).throw(
      RuntimeError("tokenizer failed")))
  with pytest.raises(RuntimeError, match="tokenizer failed"):
    tokenized.tokenized_split(corpus.corpus_spec(cfg), tok)
  folder = Path(cfg.cache_dir) / "tokenized"
  assert folder.is_dir() and not list(folder.iterdir())  # (no store, no .incomplete-*)
