"""The paper's big Transformer (Vaswani et al., 2017) on WMT'17 en→de (TFDS), newstest2014.

  pip install -e '.[wmt]'
  python train.py --config=configs/wmt_big.py --workdir=runs/wmt_big

Everything as configs/wmt_base.py except the model and schedule: d_model 1024, 16 heads, FFN
4096, dropout 0.3 (the paper's en→de value; 0.1 for en→fr), 300k steps, peak learning rate
1024^-0.5 · 4000^-0.5 = 4.9e-4. Paper result: 28.4 BLEU on newstest2014 en→de (average of the
last 20 checkpoints; 3.5 days on 8 P100 GPUs). Memory: the paper split each batch over 8 GPUs;
on fewer devices keep the batch and split it in time (`--config.num_micro_batches=4`), or recompute
activations (`--config.model.remat=dots`).
"""

from transformer_jax.configs import wmt_base


def get_config():
  config = wmt_base.get_config()
  config.num_train_steps = 300_000
  config.max_checkpoints_to_keep = 40   # the paper averages the last 20

  config.model.d_model = 1024
  config.model.num_heads = 16
  config.model.d_ff = 4096
  config.model.dropout_rate = 0.3

  config.optimizer.learning_rate = 4.9e-4  # 1024^-0.5 * 4000^-0.5
  return config
