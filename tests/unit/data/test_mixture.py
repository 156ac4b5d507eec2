"""Training on a mixture of corpora: shares of the weights, tags, exact resume, and the
config's and tokenizer's errors."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests import helpers
from transformer_jax.config.corpora import CorpusConfig
from transformer_jax.data import mixture
from transformer_jax.data import pipeline as data
from transformer_jax.data.plan import data_plan
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import ConfigError, DataError

YS = ["eins", "zwei drei", "vier fünf", "sieben", "acht neun", "zehn"]
YT = ["one", "two three", "four five", "seven", "eight nine", "ten"]
TAG = "<Y>"


def _mixture(tmp_path: Path, weights=(3.0, 1.0), tag=TAG, tags=(TAG,)):
  """(config, tokenizer) of a mixture of the 8-pair corpus `x` and the 6-pair corpus `y`,
  tagged; a tokenizer reserving `tags`."""
  cfg, _ = helpers.small_corpus(tmp_path)
  folder = tmp_path / "y"
  folder.mkdir()
  for lang, lines in (("de", YS), ("en", YT)):
    (folder / f"train.{lang}").write_text("".join(x + "\n" for x in lines))
  cfg = dataclasses.replace(cfg, corpora={
      "x": CorpusConfig(weight=weights[0]),
      "y": CorpusConfig(data_dir=str(folder), weight=weights[1], tag=tag)})
  tok = train_tokenizer(helpers.SRC + helpers.TGT + YS + YT, 90, tmp_path / "spm.model",
                        tags=tags)
  return cfg, tok


@pytest.mark.parametrize("weights", [(3.0, 1.0), (1.0, 4.0)])
def test_the_pairs_drawn_follow_the_weights_and_only_the_tagged_corpus_has_its_tag(
    tmp_path, weights):
  cfg, tok = _mixture(tmp_path, weights)
  tag_id = tok.tag_id(TAG, "test")
  y_pairs = {(tuple([tag_id] + tok.encode(s)), tuple(tok.encode(t))) for s, t in zip(YS, YT)}
  x_pairs = {(tuple(tok.encode(s)), tuple(tok.encode(t)))
             for s, t in zip(helpers.SRC, helpers.TGT)}
  pipe = data.train_pipeline(data_plan(cfg), tok, seed=0)
  it = iter(pipe.dataset)
  kept, tokens = {"x": 0, "y": 0}, {"x": 0, "y": 0}
  for _ in range(60):
    for pair in helpers.unpack_batch(pipe.take_stats(next(it))):
      assert pair in x_pairs or pair in y_pairs  # (a y pair always carries the tag, x never)
      kept["y" if pair in y_pairs else "x"] += 1
      tokens["y" if pair in y_pairs else "x"] += len(pair[0]) + len(pair[1])
  drawn = pipe.filter.corpus_pairs
  share = drawn / drawn.sum()
  want = np.asarray(weights) / sum(weights)
  # Deterministic proportional interleaving: the shares of the drawn pairs equal the weights
  # within 1% over 60 batches (hundreds of pairs); the kept ones follow, less the filtered.
  np.testing.assert_allclose(share, want, atol=0.01)
  assert drawn.sum() == pipe.filter.kept + pipe.filter.filtered
  assert kept["x"] + kept["y"] == pipe.filter.kept
  assert pipe.corpus_names == ("x", "y") and pipe.corpus_sizes == (8, 6)
  # tokens: what each corpus put into the batches (tags included)
  assert pipe.filter.corpus_tokens.tolist() == [tokens["x"], tokens["y"]]


@pytest.mark.parametrize("weights", [(0.9, 0.1), (0.5, 0.3, 0.2)])
def test_any_stretch_of_1024_pairs_holds_each_share_within_a_pair_or_two(weights):
  """The claim of docs/guides/own-data.md on the interleaving (mixture.mixed_order), over
  8,000 pairs."""
  order = mixture.mixed_order([500, 300, 200][:len(weights)], list(weights), seed=0,
                              process_index=0, process_count=1)
  corpus = np.array([order[i][0] for i in range(8_000)])
  for k, weight in enumerate(weights):
    drawn = np.concatenate([[0], np.cumsum(corpus == k)])
    per_stretch = drawn[1024:] - drawn[:-1024]
    assert np.abs(per_stretch - weight / sum(weights) * 1024).max() <= 2.0


def test_a_mixture_resumes_at_the_same_batch_with_the_same_counts(tmp_path):
  cfg, tok = _mixture(tmp_path)
  # (the per-corpus counts travel in the batches: equal batches, equal counts)
  helpers.assert_resumes_at_the_same_batches(
      lambda: data.train_pipeline(data_plan(cfg), tok, seed=5).dataset, skip=7, check=5)


def test_another_seed_shuffles_within_each_corpus_but_keeps_the_shares(tmp_path):
  cfg, tok = _mixture(tmp_path)
  firsts, shares = [], []
  for seed in (0, 1):
    pipe = data.train_pipeline(data_plan(cfg), tok, seed=seed)
    it = iter(pipe.dataset)
    firsts.append(pipe.take_stats(next(it))["inputs"])
    for _ in range(30):
      pipe.take_stats(next(it))
    shares.append(pipe.filter.corpus_pairs / pipe.filter.corpus_pairs.sum())
  assert not np.array_equal(*firsts)
  np.testing.assert_allclose(shares[0], shares[1], atol=0.01)


def test_a_tag_the_tokenizer_lacks_is_a_one_line_error_naming_the_key(tmp_path):
  cfg, tok = _mixture(tmp_path, tags=())
  with pytest.raises(DataError, match=r"config.data.corpora.y.tag='<Y>'.*has no piece"):
    data.train_pipeline(data_plan(cfg), tok, seed=0)


@pytest.mark.parametrize("entry, message", [
    ({"weight": 0.0}, r"corpora.a.weight=0.0 must be positive"),
    ({"tag": "<B T>"}, r"corpora.a.tag='<B T>' must be one token"),
    ({"source_lang": "en"}, r"corpora.a: source_lang and target_lang are both 'en'"),
    ({"wieght": 1.0}, r"unknown key config.data.corpora.a.wieght \(did you mean weight\?\)"),
])
def test_a_bad_corpus_entry_is_a_config_error_naming_it(entry, message):
  with pytest.raises(ConfigError, match=message):
    helpers.tiny_train_config(**{"data.corpora": {"a": entry}})


def test_a_mixture_needs_the_pretokenized_path():
  with pytest.raises(ConfigError, match="needs config.data.pretokenize=True"):
    helpers.tiny_train_config(**{"data.corpora": {"a": {}}, "data.pretokenize": False})
