"""One model for {de, fr, cs} -> en on Multi30k (the files of `../shared/data/multi30k/raw`,
or any folder with train/val/test_2016_flickr .{de,fr,cs,en}[.gz]), evaluated per direction.

  python train.py --config=configs/multilingual.py --workdir=runs/multi \
      [--config.data.data_dir=../shared/data/multi30k/raw]
  transformer-jax-evaluate --workdir=runs/multi     # test BLEU of each direction

The three corpora are drawn 1:1:1. Many-to-one needs no tags; for one-to-many directions
tag each corpus with its target language (e.g. tag=">>de<<", the OPUS-MT convention) and
translate with `--source_tag`. BENCHMARKS.md "Back-translation and multilingual training"
has the measured outcome against de->en alone.
"""

import ml_collections

from transformer_jax.configs import default


def get_config():
  config = default.get_config()
  config.data.data_dir = "../shared/data/multi30k/raw"  # de-en: validation and the de test
  config.data.test_split = "test_2016_flickr"
  config.data.corpora = ml_collections.ConfigDict({
      lang: dict(source_lang=lang, target_lang="en", weight=1.0,
                 test_split="" if lang == "de" else "test_2016_flickr")
      for lang in ("de", "fr", "cs")})
  return config
