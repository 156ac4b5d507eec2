"""The training pipeline, both paths (pre-tokenized and text): tokenize, filter (and count),
pack, batch, resume; the two paths make batches of the same pairs."""

import dataclasses

import pytest

from tests import helpers
from tests.helpers import SRC, TGT
from transformer_jax.data import pipeline as data
from transformer_jax.data.plan import data_plan
from transformer_jax.data.tokenizer import Tokenizer


@pytest.fixture(params=[True, False], ids=["pretokenized", "text"])
def setup(tmp_path, request):
  cfg, tok = helpers.small_corpus(tmp_path)
  return dataclasses.replace(cfg, pretokenize=request.param), tok


def _next(pipe, it):
  return pipe.take_stats(next(it))


def test_packing_round_trips_every_example_of_an_epoch(setup):
  cfg, tok = setup
  pipe = data.train_pipeline(data_plan(cfg), tok, seed=0)
  it = iter(pipe.dataset)
  pairs = [(tuple(tok.encode(s)), tuple(tok.encode(t))) for s, t in zip(SRC, TGT)]
  kept = [p for p in pairs if len(p[0]) <= 16 and len(p[1]) <= 16]
  assert pairs[5] not in kept and len(kept) >= 4  # the long sentence is filtered out
  seen = []
  while len(seen) < 3 * len(kept):
    batch = _next(pipe, it)
    assert batch["inputs"].shape == (4, 16) and batch["targets"].shape == (4, 16)
    seen += helpers.unpack_batch(batch)
  # Three epochs' worth of packed examples: every kept example, unchanged, and nothing else.
  assert set(seen) == set(kept)
  assert pipe.filter.filtered >= 1


def test_iterator_state_resumes_at_the_same_batch(setup):
  cfg, tok = setup
  helpers.assert_resumes_at_the_same_batches(
      lambda: data.train_pipeline(data_plan(cfg), tok, seed=3).dataset, skip=2, check=3)


def test_empty_training_split_is_a_clear_error(tmp_path):
  folder = tmp_path / "c"
  folder.mkdir()
  for lang in ("de", "en"):
    (folder / f"train.{lang}").write_text("")
  cfg = helpers.section("data", data_dir=str(folder), cache_dir=str(tmp_path / "tfds"),
                        eval_split="", test_split="")
  with pytest.raises(Exception, match="empty"):
    data.train_pipeline(data_plan(cfg), None, seed=0)


def _corpus(tmp_path, pairs):
  folder = tmp_path / "bad"
  folder.mkdir()
  for lang, side in (("de", 0), ("en", 1)):
    (folder / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
  return folder


def test_empty_and_overlong_pairs_are_filtered_and_counted(setup, tmp_path):
  cfg, tok = setup
  pairs = list(zip(SRC, TGT)) + [("", "an empty source"), ("eine leere übersetzung", "  ")]
  cfg = dataclasses.replace(cfg, data_dir=str(_corpus(tmp_path, pairs)), eval_split="",
                            max_source_length=12, max_target_length=12)
  pipeline = data.train_pipeline(data_plan(cfg), tok, seed=0)
  it = iter(pipeline.dataset)
  while pipeline.filter.kept + pipeline.filter.filtered < 2 * len(pairs):  # two epochs
    _next(pipeline, it)
  f = pipeline.filter
  assert f.empty >= 4 and f.too_long >= 2  # 2 empty pairs and the long one, per epoch
  assert f.filtered == f.empty + f.too_long
  assert "with an empty side" in f.summary() and "max_source_length=12" in f.summary()


def test_dataset_empty_after_filtering_is_a_clear_error(setup, tmp_path):
  cfg, tok = setup
  pairs = [("ein sehr langer satz " * 8, "a very long sentence " * 8), ("", "nothing")] * 3
  cfg = dataclasses.replace(cfg, data_dir=str(_corpus(tmp_path, pairs)), eval_split="")
  with pytest.raises(Exception, match=r"no usable training pair .*6 in this host's shard.*"
                                      r"3 with an empty side, 3 longer than"):
    next(iter(data.train_pipeline(data_plan(cfg), tok, seed=0).dataset))


def test_pretokenized_batches_hold_the_pairs_of_the_text_pipeline(tfds_cache, tiny_tokenizer):
  """Same seed, same shard (host 1 of 2): every batch of the pre-tokenized path holds exactly
  the pairs (ids) of the text path's batch (first-fit packing of the same stream), into the
  second epoch."""
  host = (1, 2)
  cfg = helpers.section("data", cache_dir=str(tfds_cache), max_source_length=20,
                        max_target_length=20, batch_size=8)
  tok = Tokenizer.load(tiny_tokenizer)
  text = iter(data.train_pipeline(data_plan(dataclasses.replace(cfg, pretokenize=False)), tok, 5,
                                  *host).dataset)
  pipe = data.train_pipeline(data_plan(cfg), tok, 5, *host)
  it = iter(pipe.dataset)
  while pipe.epochs < 1.1:
    assert sorted(helpers.unpack_batch(next(text))) == sorted(helpers.unpack_batch(_next(pipe, it)))
  assert pipe.filter.too_long > 0 and pipe.filter.kept > 0


def test_pretokenized_counts_are_the_pairs_the_batches_took(tmp_path):
  cfg, tok = helpers.small_corpus(tmp_path)
  pipe = data.train_pipeline(data_plan(cfg), tok, seed=1)
  it = iter(pipe.dataset)
  kept = sum(len(helpers.unpack_batch(_next(pipe, it))) for _ in range(7))
  assert pipe.filter.kept == kept
  # The stream's pairs up to the last one taken, as a count over the shuffled order.
  taken = pipe.filter.kept + pipe.filter.filtered
  order = data._order(8, 1, 0, 1)
  too_long = sum(max(len(tok.encode(SRC[order[i]])), len(tok.encode(TGT[order[i]]))) > 16
                 for i in range(taken))
  assert pipe.filter.too_long == too_long > 0 and pipe.filter.empty == 0
  assert pipe.epochs == taken / 8




def test_subword_sampling_segments_pairs_anew_each_epoch_and_resumes_bit_for_bit(tmp_path):
  """config.data.subword_sampling: a sentence seen in several epochs gets several segmentations,
  each spelling the sentence; a restored iterator draws the same ones (two reader threads)."""
  cfg, tok = helpers.small_corpus(tmp_path)
  cfg = dataclasses.replace(cfg, num_threads=2, subword_sampling={"alpha": 0.2})
  pipe = data.train_pipeline(data_plan(cfg), tok, seed=0)
  it, seen = iter(pipe.dataset), {}
  for _ in range(12):  # (about 6 epochs of the 7 short pairs)
    for src, tgt in helpers.unpack_batch(_next(pipe, it)):
      seen.setdefault(tok.detokenize(src), set()).add(src)
      assert tok.detokenize(tgt) in TGT
  assert set(seen) <= set(SRC) and len(seen) >= 5
  assert max(len(ways) for ways in seen.values()) >= 3  # a sentence segmented 3+ ways
  helpers.assert_resumes_at_the_same_batches(
      lambda: data.train_pipeline(data_plan(cfg), tok, seed=0).dataset, skip=5, check=4)
  off = data.train_pipeline(
      data_plan(dataclasses.replace(cfg, subword_sampling={"alpha": 0.0})), tok, 0)
  it = iter(off.dataset)
  for _ in range(6):
    for src, _tgt in helpers.unpack_batch(_next(off, it)):
      assert src == tuple(tok.encode(tok.detokenize(src)))  # off: the one best segmentation
