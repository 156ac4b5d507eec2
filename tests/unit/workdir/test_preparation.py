"""Preparing a config's data ahead of training: every corpus of a mixture prepared and
tokenized, the tokenizer trained with the mixture's tags."""

import ml_collections

from tests import helpers
from transformer_jax.config.parse import from_config_dict
from transformer_jax.workdir.preparation import prepare


def test_a_mixture_is_prepared_corpus_by_corpus_with_its_tags_reserved(tmp_path):
  cfg, _ = helpers.small_corpus(tmp_path)  # (an 8-pair folder: train and val)
  c = helpers.tiny_config(**{"data.cache_dir": str(tmp_path / "cache"), "data.eval_split": "val",
                             "model.vocab_size": 120})
  c.data.corpora = ml_collections.ConfigDict({
      "small": dict(data_dir=cfg.data_dir, tag="<S>", test_split="val"),
      "multi30k": dict(tag="<M>")})
  sizes, tok = prepare(from_config_dict(c), tmp_path / "run")
  assert sizes["corpus small (train) as token ids"] == 8
  assert sizes["corpus multi30k (train) as token ids"] == 29000
  assert sizes[f"{cfg.data_dir}:val"] == 8 and sizes["local:val"] == 1014
  assert tok.tag_id("<S>", "t") != tok.tag_id("<M>", "t")
  assert tok.pieces([tok.tag_id("<S>", "t")]) == ["<S>"]
