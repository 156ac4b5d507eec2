"""Tatoeba de→en (manythings.org/Anki pairs, 170k) tested on tatoeba-test v2021-08-07.

  make tatoeba-data          # the leak-free split: data/tatoeba-deen/{train,dev,test}.{de,en}.gz
  python train.py --config=configs/tatoeba_deen.py --workdir=runs/tatoeba_deen

From an installed wheel, the same split (Tatoeba's deu.txt.gz and the Tatoeba-test files are
the user's downloads; see the Makefile's `tatoeba-data` for every --test/--exclude file):
  transformer-jax-split-corpus --pairs=deu.txt.gz --columns=en,de --group_by=en \
      --dedup_test_by=de --out=data/tatoeba-deen --test=de=TEST.deu.gz,en=TEST.eng.gz
  transformer-jax-train --config=configs/tatoeba_deen.py --workdir=runs/tatoeba_deen

The split (transformer_jax/data/splitting.py) groups pairs by English sentence (all translations
of a sentence in one split, 1% of sentences for dev), removes every pair with a side that occurs
in any Tatoeba-test version, and writes the v2021-08-07 test set deduplicated by German source
(16,739 sentences, one reference each). Model: configs/vaswani.py's 3+3-layer d_model-256
Transformer with a joint 8k SentencePiece; sized to train in under an hour on 2 CPU cores (result and time: see
BENCHMARKS.md). `--config.data.source_lang=en --config.data.target_lang=de` trains en→de (its
test set then has several references per English sentence as separate lines: regenerate the split
with --dedup_test_by=en).
"""

from transformer_jax.configs import vaswani


def get_config():
  config = vaswani.get_config()
  config.num_train_steps = 2700
  config.time_budget_minutes = 0.0       # the step count is the recipe (no time limit)
  config.optimizer.cooldown_fraction = 0.0
  config.log_every_steps = 100
  config.eval_every_steps = 900
  config.checkpoint_every_steps = 500
  config.eval_max_sentences = 0          # the whole dev split (~1.5k sentences)

  config.data.dataset = "local"
  config.data.data_dir = "data/tatoeba-deen"
  config.data.train_split = "train"
  config.data.eval_split = "dev"
  config.data.test_split = "test"
  config.data.max_source_length = 64
  config.data.max_target_length = 64
  config.data.batch_size = 64            # packed rows of 64 tokens per side

  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 400
  return config
