"""The paper's base Transformer trained on WMT'17 de→en (TFDS), tested on newstest2014.

  pip install -e '.[wmt]'    # TFDS's WMT builders need TensorFlow
  python train.py --config=configs/wmt_base.py --workdir=runs/wmt_base

Needs internet access for TFDS to download WMT (not available on the development machine,
where this config is only checked to build). Model: 6+6 layers, d_model 512, 8 heads, FFN 2048,
dropout 0.1, a joint 32k SentencePiece model (Vaswani et al., 2017: 27.3 BLEU on newstest2014
en→de, base model, 100k steps of ~25k tokens on 8 P100 GPUs).
"""

from configs import default


def get_config():
  config = default.get_config()
  config.num_train_steps = 100_000
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 5000
  config.eval_max_sentences = 0

  config.model.vocab_size = 32000
  config.model.d_model = 512
  config.model.num_heads = 8
  config.model.d_ff = 2048
  config.model.num_encoder_layers = 6
  config.model.num_decoder_layers = 6
  config.model.dropout_rate = 0.1
  config.model.dtype = "bfloat16"

  config.data.dataset = "wmt17_translate/de-en"  # TFDS name; features {'de', 'en'}
  config.data.train_split = "train"
  config.data.eval_dataset = "wmt14_translate/de-en"
  config.data.eval_split = "validation"   # newstest2013 (wmt14's validation)
  config.data.test_dataset = "wmt14_translate/de-en"
  config.data.test_split = "test"         # newstest2014 (wmt14's test)
  config.data.tokenizer_max_sentences = 2_000_000
  config.data.max_source_length = 128
  config.data.max_target_length = 128
  config.data.batch_size = 256            # packed rows of 128: ~25k source+target tokens

  config.optimizer.learning_rate = 7e-4
  config.optimizer.warmup_steps = 4000

  config.decode.beam_size = 4
  config.decode.length_penalty = 0.6
  config.decode.max_length = 256
  config.decode.max_length_a = 1.5
  config.decode.max_length_b = 10
  config.decode.batch_size = 64
  return config
