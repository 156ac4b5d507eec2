"""The paper's base Transformer (Vaswani et al., 2017) on WMT'17 en→de (TFDS), newstest2014.

  pip install -e '.[wmt]'    # TFDS's WMT builders need TensorFlow (prepare once, then read
                             # through array_record like every other dataset)
  python train.py --config=configs/wmt_base.py --workdir=runs/wmt_base

TFDS downloads and prepares WMT'17 (5.9M pairs) into config.data.cache_dir on first use; this
needs internet, so on the offline development machine the config is exercised with TFDS mock
data (tests/test_wmt.py). Direction: en→de as in the paper; de→en with
`--config.data.source_lang=de --config.data.target_lang=en`.

As in the paper: 6+6 layers, d_model 512, 8 heads, FFN 2048, dropout 0.1, post-LN, label
smoothing 0.1, Adam(0.9, 0.98, 1e-9) with 4000 warmup steps and inverse-sqrt decay (peak
d_model^-0.5 · 4000^-0.5 = 7e-4), batches of ~25k source and ~25k target tokens, 100k steps,
beam 4 with length penalty 0.6, a joint 32k SentencePiece (the paper: 37k BPE) trained on a
10M-character sample of the training data. Paper result: 27.3 BLEU on newstest2014 en→de
(tokenized BLEU, average of the last 5 checkpoints; 12 h on 8 P100 GPUs). When the devices
cannot hold a 256-row batch, keep the batch and split it: `--config.num_micro_batches=4`.
"""

from transformer_jax.configs import vaswani


def get_config():
  config = vaswani.get_config()
  config.num_train_steps = 100_000
  config.time_budget_minutes = 0.0      # the step count is the recipe (no time limit)
  config.optimizer.cooldown_fraction = 0.0
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2500
  config.max_checkpoints_to_keep = 20   # for checkpoint averaging (the paper: last 5)
  config.eval_max_sentences = 1000      # newstest2013 sentences decoded at each eval

  config.model.vocab_size = 32000
  config.model.d_model = 512
  config.model.num_heads = 8
  config.model.d_ff = 2048
  config.model.num_encoder_layers = 6
  config.model.num_decoder_layers = 6
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.0
  config.model.ffn_dropout_rate = 0.0
  config.model.pre_layer_norm = False   # the paper's post-LN (True: pre-LN, more forgiving)
  config.model.dtype = "auto"           # bf16 on GPUs/TPUs and bf16-capable CPUs, else f32

  config.data.dataset = "wmt17_translate/de-en"  # TFDS name; features {'de', 'en'}
  config.data.source_lang = "en"
  config.data.target_lang = "de"
  config.data.train_split = "train"
  config.data.eval_dataset = "wmt14_translate/de-en"
  config.data.eval_split = "validation"   # newstest2013 (wmt14's validation)
  config.data.test_dataset = "wmt14_translate/de-en"
  config.data.test_split = "test"         # newstest2014 (wmt14's test)
  config.data.tokenizer_max_sentences = 2_000_000
  config.data.tokenizer_max_chars = 10_000_000
  config.data.max_source_length = 128
  config.data.max_target_length = 128
  config.data.batch_size = 256            # packed rows of 128 per side: ~25k tokens per side
  config.data.num_threads = 8

  config.optimizer.learning_rate = 7e-4   # 512^-0.5 * 4000^-0.5
  config.optimizer.warmup_steps = 4000
  config.optimizer.grad_clip_norm = 0.0   # the paper clips nothing

  config.decode.beam_size = 4
  config.decode.length_penalty = 0.6
  config.decode.max_length = 256
  config.decode.max_length_a = 1.0        # the paper: input length + 50
  config.decode.max_length_b = 50
  config.decode.batch_size = 64
  return config
