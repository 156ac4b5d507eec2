"""The training pipeline (tokenize, filter, pack, batch, resume) and eval batches."""

import dataclasses
import gzip

import numpy as np
import pytest

from transformer_jax import data
from transformer_jax.tokenizer import train_tokenizer

SRC = ["ein kleiner hund", "zwei katzen schlafen", "ein mann", "eine frau liest ein buch",
       "kinder spielen im park", ("ein sehr langer satz " * 8).strip(), "der hund rennt", "ja"]
TGT = ["a small dog", "two cats sleep", "a man", "a woman reads a book",
       "children play in the park", ("a very long sentence " * 8).strip(), "the dog runs", "yes"]


@pytest.fixture()
def setup(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  for split, n in (("train", 1), ("val", 1)):
    for lang, lines in (("de", SRC), ("en", TGT)):
      (folder / f"{split}.{lang}.gz").write_bytes(
          gzip.compress("".join(x + "\n" for x in lines * n).encode()))
  cfg = data.DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "tfds"), test_split="",
                        max_source_length=16, max_target_length=16, batch_size=4,
                        num_threads=1)
  tok = train_tokenizer(SRC + TGT, 70, tmp_path / "spm.model")
  return cfg, tok


def _unpack(batch):
  """The (inputs, targets) examples of a packed batch, recovered from segment ids."""
  out = []
  for row in range(batch["inputs"].shape[0]):
    for seg in sorted(set(batch["inputs_segment_ids"][row]) - {0}):
      src_mask = batch["inputs_segment_ids"][row] == seg
      tgt_mask = batch["targets_segment_ids"][row] == seg
      src, tgt = batch["inputs"][row][src_mask], batch["targets"][row][tgt_mask]
      # Positions restart at 0 for every packed example.
      np.testing.assert_array_equal(batch["inputs_positions"][row][src_mask],
                                    np.arange(len(src)))
      np.testing.assert_array_equal(batch["targets_positions"][row][tgt_mask],
                                    np.arange(len(tgt)))
      out.append((tuple(src), tuple(tgt)))
  return out


def test_packing_round_trips_every_example_of_an_epoch(setup):
  cfg, tok = setup
  pipe = data.train_pipeline(cfg, tok, seed=0)
  it = iter(pipe.dataset)
  pairs = [(tuple(tok.encode(s)), tuple(tok.encode(t))) for s, t in zip(SRC, TGT)]
  kept = [p for p in pairs if len(p[0]) <= 16 and len(p[1]) <= 16]
  assert pairs[5] not in kept and len(kept) >= 4  # the long sentence is filtered out
  seen = []
  while len(seen) < 3 * len(kept):
    batch = next(it)
    assert batch["inputs"].shape == (4, 16) and batch["targets"].shape == (4, 16)
    seen += _unpack(batch)
  # Three epochs' worth of packed examples: every kept example, unchanged, and nothing else.
  assert set(seen) == set(kept)
  assert pipe.filter.filtered >= 1


def test_iterator_state_resumes_at_the_same_batch(setup):
  cfg, tok = setup
  it = iter(data.train_pipeline(cfg, tok, seed=3).dataset)
  for _ in range(2):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  it2 = iter(data.train_pipeline(cfg, tok, seed=3).dataset)
  it2.set_state(state)
  for want in expected:
    got = next(it2)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_eval_batches_are_fixed_shape_and_cover_every_sentence(setup):
  cfg, tok = setup
  ev = data.load_eval_set(cfg, "val", tok)
  assert ev.sources == SRC and ev.references == TGT
  seen = []
  for rows, batch in ev.batches(batch_size=3, max_len=64, bucket=8):
    assert batch["inputs"].shape[0] == 3 and batch["inputs"].shape[1] % 8 == 0
    for r, i in enumerate(rows):
      n = min(len(ev.source_ids[i]), batch["inputs"].shape[1])  # longer ones are truncated
      np.testing.assert_array_equal(batch["inputs"][r, :n], ev.source_ids[i][:n])
      assert np.all(batch["inputs"][r, n:] == 0)
    assert np.all(batch["inputs"][len(rows):] == 0)  # filler rows are empty
    seen += list(rows)
  assert sorted(seen) == list(range(len(SRC)))


def test_empty_training_split_is_a_clear_error(tmp_path):
  folder = tmp_path / "c"
  folder.mkdir()
  for lang in ("de", "en"):
    (folder / f"train.{lang}").write_text("")
  cfg = data.DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "tfds"), eval_split="",
                        test_split="")
  with pytest.raises(Exception, match="empty"):
    data.train_pipeline(cfg, None, seed=0)


def test_data_config_rejects_same_languages():
  with pytest.raises(ValueError, match="source_lang and target_lang"):
    dataclasses.replace(data.DataConfig(), target_lang="de")


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
  pipeline = data.train_pipeline(cfg, tok, seed=0)
  it = iter(pipeline.dataset)
  while pipeline.filter.kept + pipeline.filter.filtered < 2 * len(pairs):  # two epochs
    next(it)
  f = pipeline.filter
  assert f.empty >= 4 and f.too_long >= 2  # 2 empty pairs and the long one, per epoch
  assert f.filtered == f.empty + f.too_long
  assert "with an empty side" in f.summary() and "max_source_length=12" in f.summary()


def test_dataset_empty_after_filtering_is_a_clear_error(setup, tmp_path):
  cfg, tok = setup
  pairs = [("ein sehr langer satz " * 8, "a very long sentence " * 8), ("", "nothing")] * 3
  cfg = dataclasses.replace(cfg, data_dir=str(_corpus(tmp_path, pairs)), eval_split="")
  pipeline = data.train_pipeline(cfg, tok, seed=0)
  with pytest.raises(Exception, match=r"no usable training pair .*6 in this host's shard.*"
                                      r"3 with an empty side, 3 longer than"):
    next(iter(pipeline.dataset))
