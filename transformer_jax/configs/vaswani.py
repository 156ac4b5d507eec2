"""The paper's Transformer at the demo's size: Multi30k de→en (embedded), sinusoidal positions,
LayerNorm, ReLU feed-forward, no weight averaging and no subword sampling (Vaswani et al.,
2017), as configs/default.py was until the recipe search replaced it (BENCHMARKS.md, "The
default recipe").

  python train.py --config=configs/vaswani.py --workdir=runs/vaswani

Everything not set here is configs/default.py's (3+3 layers, d_model 256, 4 heads, FFN 1024,
joint 8k SentencePiece, pre-LN as the default has it: `--config.model.pre_layer_norm=false` for
the paper's post-LN). Measured as the default (AVX-512-bf16 EPYC, 2 cores, 1,000 steps in
about 11 minutes of training): test2016 sacreBLEU 38.49, chrF 58.39.
"""

from transformer_jax.configs import default


def get_config():
  config = default.get_config()
  config.num_train_steps = 1000
  config.eval_every_steps = 250
  config.label_smoothing = 0.1
  config.model.positional_encoding = "sinusoidal"
  config.model.norm = "layernorm"
  config.model.ffn_activation = "relu"
  config.model.dropout_rate = 0.1
  config.model.num_encoder_layers = 3
  config.model.num_decoder_layers = 3
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.ema_decay = 0.0
  config.data.subword_sampling.alpha = 0.0
  return config
