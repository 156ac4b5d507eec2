"""Multi30k en→de (embedded), the default recipe trained for up to an hour on 2 CPU cores.

  python train.py --config=configs/multi30k_ende.py --workdir=runs/multi30k_ende

configs/default.py (3+3 layers, d_model 256, rotary positions, RMSNorm, EMA 0.999, peak lr 3e-3)
with the languages swapped, subword regularization (SentencePiece sampling, alpha 0.5: +1.6
validation BLEU de→en at 1,200 steps) and a longer run: 2,500 steps (~21 epochs) or
58 minutes of training, whichever ends first, the learning rate cooled down over the last 20% of
either. 2,500: where a 58-minute run's validation BLEU and loss peaked (40.61, 1.598; 39.71 and
1.652 at its end, step 3,977: over-fitted). Validation every 500 steps keeps the best checkpoint.
Measured: BENCHMARKS.md, "Multi30k en→de".
"""

from transformer_jax.configs import default


def get_config():
  config = default.get_config()
  config.data.source_lang = "en"
  config.data.target_lang = "de"
  config.data.subword_sampling.alpha = 0.5
  config.num_train_steps = 2500
  config.time_budget_minutes = 58.0   # of training: the run ends within the hour on any CPU
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 250
  return config
