"""The data plan: config.data resolved once into named corpora (a corpus alone is a plan of
one), their evaluation and test splits by metric name, and the one stream of tokenizer
training sentences."""

import dataclasses

from tests import helpers
from transformer_jax.config.corpora import CorpusConfig
from transformer_jax.data import corpus
from transformer_jax.data.pipeline import training_sentences
from transformer_jax.data.plan import data_plan


def _mixture(tmp_path, cfg):
  """`cfg` training on its own corpus `x` and on `y` (6 pairs, tagged, validated on its
  training split)."""
  folder = tmp_path / "y"
  folder.mkdir()
  for lang, lines in (("de", helpers.SRC[:6]), ("en", helpers.TGT[:6])):
    (folder / f"train.{lang}").write_text("".join(x + "\n" for x in lines))
  return dataclasses.replace(cfg, corpora={
      "x": CorpusConfig(weight=3.0),
      "y": CorpusConfig(data_dir=str(folder), tag="<Y>", eval_split="train")})


def test_a_corpus_alone_is_a_plan_of_one_read_where_the_config_says(tmp_path):
  cfg, _ = helpers.small_corpus(tmp_path)
  cfg = dataclasses.replace(cfg, eval_split="val", test_split="val")
  plan = data_plan(cfg)
  (own,) = plan.corpora
  assert not plan.mixed and own.name == "" and own.train == corpus.corpus_spec(cfg)
  assert own.split == "train" and own.label == "local:train" and plan.tags == []
  assert [(s.name, s.split, s.corpus) for s in plan.eval_splits] == [("", "val", None)]
  assert [(s.name, s.split) for s in plan.test_splits] == [("val", "val")]
  assert sum(1 for _ in training_sentences(plan)) == 2 * len(helpers.SRC)


def test_a_mixture_plans_its_corpora_in_config_order_with_their_own_splits(tmp_path):
  cfg, _ = helpers.small_corpus(tmp_path)
  plan = data_plan(_mixture(tmp_path, dataclasses.replace(cfg, eval_split="")))
  assert plan.mixed and [c.name for c in plan.corpora] == ["x", "y"]
  assert [(c.weight, c.tag) for c in plan.corpora] == [(3.0, ""), (1.0, "<Y>")]
  assert plan.tags == ["<Y>"] and plan.corpora[1].label == "corpus y (train)"
  # (no validation on config.data's own split, "": only y's, by the name its metrics carry)
  (y_eval,) = plan.eval_splits
  assert y_eval.name == "y.train" and y_eval.corpus is plan.corpora[1]
  assert y_eval.spec.splits == ("train",) and plan.corpus_split("y.train") == y_eval
  assert plan.corpus_split("x.train") is None
  assert sum(1 for _ in training_sentences(plan)) == 2 * (len(helpers.SRC) + 6)


def test_preparation_serves_every_split_the_config_names_once(tmp_path):
  cfg, _ = helpers.small_corpus(tmp_path)
  plan = data_plan(_mixture(tmp_path, dataclasses.replace(cfg, eval_split="val")))
  assert [(spec.data_dir, spec.splits) for spec in plan.prepared] == [
      (cfg.data_dir, ("val",)), (cfg.data_dir, ("train",)), (str(tmp_path / "y"), ("train",))]
