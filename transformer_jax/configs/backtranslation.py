"""Tagged back-translation (Caswell et al., 2019): configs/vaswani.py's model trained on a mix of
real pairs and back-translated ones, the synthetic sources tagged `<BT>`.

  # 1. a reverse (en->de) run on the real pairs, 2. back-translate English monolingual text
  python train.py --config=configs/default.py --config.data.source_lang=en \
      --config.data.target_lang=de --config.data.data_dir=REAL --workdir=runs/ende
  transformer-jax-translate-corpus --workdir=runs/ende --input=MONO.en --out=BT --tag='<BT>'
  # 3. de->en on both (validation and test on REAL's val / test2016)
  python train.py --config=configs/backtranslation.py --config.data.data_dir=REAL \
      --config.data.corpora.bt.data_dir=BT --workdir=runs/deen_bt

The weights are shares of the pairs drawn (1:1 here, as many synthetic as real pairs per
batch); BENCHMARKS.md "Back-translation and multilingual training" has the measured outcome.
"""

import ml_collections

from transformer_jax.configs import vaswani


def get_config():
  config = vaswani.get_config()
  config.data.corpora = ml_collections.ConfigDict({
      "real": dict(weight=1.0),               # config.data.data_dir's training split
      "bt": dict(data_dir="", weight=1.0, tag="<BT>"),  # set data_dir: the tool's --out
  })
  return config
