"""One model for {de, fr, cs} -> en on Multi30k (embedded in the package: train, val and
test2016 in all four languages; or any folder with the same file names,
`--config.data.data_dir=DIR`), evaluated per direction.

  transformer-jax-train --config=configs/multilingual.py --workdir=runs/multi
  transformer-jax-evaluate --workdir=runs/multi     # test BLEU of each direction

The three corpora are drawn 1:1:1. Many-to-one needs no tags; for one-to-many directions
tag each corpus with its target language (e.g. tag=">>de<<", the OPUS-MT convention) and
translate with `--source_tag`. BENCHMARKS.md "Back-translation and multilingual training"
has the measured outcome against de->en alone.
"""

import ml_collections

from transformer_jax.configs import vaswani


def get_config():
  config = vaswani.get_config()
  config.data.data_dir = ""             # the embedded Multi30k; de-en: validation, the de test
  config.data.test_split = "test2016"
  config.data.corpora = ml_collections.ConfigDict({
      lang: dict(source_lang=lang, target_lang="en", weight=1.0,
                 test_split="" if lang == "de" else "test2016")
      for lang in ("de", "fr", "cs")})
  return config
