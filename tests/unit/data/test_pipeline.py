"""The training pipeline: tokenize, filter (and count), pack, batch, resume."""

import dataclasses

import numpy as np
import pytest

from tests import helpers
from tests.helpers import SRC, TGT
from transformer_jax.data import pipeline as data


@pytest.fixture()
def setup(tmp_path):
  return helpers.small_corpus(tmp_path)


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


def test_empty_training_split_is_a_clear_error(tmp_path):
  folder = tmp_path / "c"
  folder.mkdir()
  for lang in ("de", "en"):
    (folder / f"train.{lang}").write_text("")
  cfg = helpers.section("data", data_dir=str(folder), cache_dir=str(tmp_path / "tfds"),
                        eval_split="", test_split="")
  with pytest.raises(Exception, match="empty"):
    data.train_pipeline(cfg, None, seed=0)


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
