"""Evaluation sets: fixed-shape, length-sorted batches covering every sentence; sets made from
sentences without references."""

import numpy as np

from tests import helpers
from tests.helpers import SRC, TGT
from transformer_jax.data import eval_sets as data


def test_eval_batches_are_fixed_shape_and_cover_every_sentence(tmp_path):
  cfg, tok = helpers.small_corpus(tmp_path)
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


def test_eval_set_from_pairs_handles_translation_without_references():
  class Tok:
    def encode(self, s, side="source"):
      return [3] * len(s.split()) + [1]
  ev = data.EvalSet.from_pairs(["a b", "c"], [], Tok())
  assert ev.references == ["", ""] and len(ev) == 2


def test_a_split_the_config_does_not_name_is_prepared_on_its_own(tmp_path):
  """(evaluate --split=test2016 on a run trained with test_split="" ended in TFDS's "Unknown
  split" traceback: the prepared corpus held only the config's splits.)"""
  cfg, tok = helpers.small_corpus(tmp_path)
  data.load_eval_set(cfg, "val", tok)  # (the corpus prepared with the config's splits first)
  for lang, lines in (("de", SRC[:3]), ("en", TGT[:3])):
    (tmp_path / "corpus" / f"extra.{lang}").write_text("".join(x + "\n" for x in lines))
  ev = data.load_eval_set(cfg, "extra", tok)
  assert ev.sources == SRC[:3] and ev.references == TGT[:3]
