"""Tiny config for tests and smoke runs (embedded Multi30k de→en, a 2-layer d_model-32 model).

  python train.py --config=configs/tiny.py --workdir=/tmp/tiny

Runtime: well under a minute on 2 CPU cores. Result: not a useful model (BLEU ≈ 0); it
exercises every stage: tokenizer, packing, training, checkpoint, evaluation, beam search.
"""

from transformer_jax.configs import vaswani


def get_config():
  config = vaswani.get_config()
  config.num_train_steps = 20
  config.time_budget_minutes = 0.0
  config.optimizer.cooldown_fraction = 0.0
  config.log_every_steps = 5
  config.eval_every_steps = 10
  config.checkpoint_every_steps = 10
  config.eval_max_sentences = 32     # decode only a few validation sentences

  config.model.vocab_size = 500
  config.model.d_model = 32
  config.model.num_heads = 4
  config.model.d_ff = 64
  config.model.num_encoder_layers = 2
  config.model.num_decoder_layers = 2
  config.model.dtype = "float32"

  config.data.tokenizer_max_sentences = 5000
  config.data.max_source_length = 32
  config.data.max_target_length = 32
  config.data.batch_size = 16
  config.data.test_split = ""        # no test decode in smoke runs

  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 10

  config.decode.beam_size = 2
  config.decode.max_length = 32
  config.decode.batch_size = 32
  config.decode.num_samples_to_log = 2
  return config
