"""Default config: Multi30k de→en (embedded), a Transformer sized for 2 CPU cores.

  python train.py --config=configs/default.py --workdir=runs/default     (or: make demo)

Model: 3+3 layers, d_model 256, 4 heads, FFN 1024, joint 8k SentencePiece, rotary positions,
RMSNorm, a moving average of the weights, peak learning rate 3e-3: the recipe the project's own
sweep chose on validation BLEU (configs/sweeps/recipe_tpe.py; the paper's choices are
configs/vaswani.py). Matmuls in bf16 with f32 accumulation where the hardware multiplies bf16
faster, else f32 (dtype "auto"). The number of steps is planned to fit the whole run into 18
minutes on the machine it lands on (config.plan: its step timed before step 1), with subword
sampling in runs long enough to gain from it. Runtime and result per CPU kind: BENCHMARKS.md,
"A demo that fits the machine".
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0                       # parameters, dropout (and data_seed -1: data order)
  config.data_seed = -1                 # the batches' order and tokenizer sample; -1 = seed
  config.num_train_steps = 0            # optimizer steps; 0 = as many as fit config.plan.minutes
  config.log_every_steps = 50           # train metrics and the progress line
  config.eval_every_steps = 400         # validation loss + BLEU (and at the last step); a
                                        # planned run's are at least this far apart
  config.checkpoint_every_steps = 100   # Orbax checkpoint (and at the last step)
  config.eval_every_minutes = 0.0       # also validate after this much wall clock; 0 = off
  config.checkpoint_every_minutes = 0.0  # also checkpoint after this much wall clock; 0 = off
  config.max_checkpoints_to_keep = 5    # newest ones; the best by BLEU is kept apart
  config.label_smoothing = 0.1
  config.eval_max_sentences = 0         # validation sentences decoded for BLEU; 0 = all
  config.early_stopping_patience = 0    # stop after N evals without better BLEU; 0 = never
  config.num_micro_batches = 1          # gradient accumulation: k micro-batches per step
  config.nonfinite_updates = "stop"     # NaN/Inf loss or gradient: "stop" the run or "skip" it
  # Training ends (saved, validated, tested) after this many minutes of the training loop, summed
  # over resumed runs, if num_train_steps is not reached first; 0 = no limit. A planned run's
  # own budget (its planned training time and 5%) holds where it is shorter.
  config.time_budget_minutes = 22.0
  # With num_train_steps 0, the steps are planned to fit the whole run (set-up, training, the
  # validations and the test) into `minutes` from the command's start, from this machine's step
  # time measured before step 1 (`probe_steps` timed); the plan is printed, kept in the workdir
  # (plan.json: a resumed run keeps it) and config.json records the steps it chose.
  config.plan = ml_collections.ConfigDict(dict(
      minutes=18.0,              # `make demo` within 20 minutes with the install
      f32_minutes=23.0,          # where bf16 is slow (AVX2 CPUs): within 25
      max_steps=2500,            # a faster machine stops here: Multi30k en→de over-fitted
                                 # beyond (BENCHMARKS.md, "Multi30k en→de")
      probe_steps=3,
      validation_share=0.05,     # of the training time, for the validations before the last
      # from 1,000 planned steps subword sampling at alpha 0.5 (config.data.subword_sampling);
      # shorter runs lose by it (BENCHMARKS.md, "The default recipe and how it was chosen")
      sampling_from_steps=1000,
      sampling_alpha=0.5,
  ))

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 8000        # joint source+target SentencePiece pieces
  config.model.d_model = 256            # embedding / residual width
  config.model.num_heads = 4            # attention heads (d_model % num_heads == 0)
  config.model.d_ff = 1024              # feed-forward hidden width
  config.model.num_encoder_layers = 3
  config.model.num_decoder_layers = 3
  config.model.dropout_rate = 0.1       # embeddings and residual branches
  config.model.attention_dropout_rate = 0.0
  config.model.ffn_dropout_rate = 0.0
  config.model.pre_layer_norm = True    # False: the paper's post-LN
  config.model.norm = "rmsnorm"         # or "layernorm"
  config.model.norm_epsilon = 1e-6      # in the norms' denominators (PyTorch's: 1e-5)
  config.model.ffn_activation = "relu"  # "gelu", "silu", or gated "swiglu"/"geglu" (3 d_ff matrices)
  config.model.num_kv_heads = 0         # key/value heads (grouped-query); 0 = num_heads
  config.model.positional_encoding = "rotary"  # "sinusoidal" (+"_concat": sin|cos halves),
                                        # "learned"; "relative" (T5 bias)
  config.model.relative_num_buckets = 32  # "relative": offset buckets (T5's)
  config.model.relative_max_distance = 128  # "relative": longer offsets share the last bucket
  config.model.max_len = 256            # longest position (source, target, decode)
  config.model.share_embeddings = True  # one table for source and target
  config.model.scale_embeddings = True  # token embeddings times sqrt(d_model)
  config.model.tie_output_embedding = True  # softmax weights = target embedding
  config.model.output_bias = False      # a learned bias on the output logits (Marian's)
  config.model.qk_norm = False          # RMSNorm of each head's self-attention queries and keys
  config.model.dtype = "auto"           # matmul inputs: "bfloat16" (f32 accumulation) where the
                                        # hardware multiplies bf16 faster, else "float32" (exact)
  config.model.attention_impl = "auto"  # "einsum", "xla", "cudnn" or "softmax_once"; auto:
                                        # cudnn on GPUs, softmax_once on TPUs, einsum on CPUs
  config.model.activation_dtype = "auto"  # between matmuls, with bf16 matmuls: "bfloat16" or
                                        # "float32"; auto: bf16 on GPUs, f32 elsewhere
  config.model.logits_dtype = "auto"    # the fused loss's logits, with bf16 matmuls: "bfloat16"
                                        # or "float32"; auto: bf16 on TPUs, f32 elsewhere
  config.model.loss_tile_tokens = 256   # output layer + loss in tiles of tokens (accelerators:
                                        # >= 8192); 0 = one tile
  config.model.remat = "none"           # "full" / "dots": recompute activations (less memory)
  config.model.scan_layers = False      # nn.scan over layers: faster compiles for deep models

  config.data = ml_collections.ConfigDict()
  config.data.dataset = "local"         # folder of {split}.{lang}[.gz] files, or a TFDS name
  config.data.data_dir = ""             # "" = the embedded Multi30k corpus
  config.data.source_lang = "de"        # swap with target_lang for en→de
  config.data.target_lang = "en"
  config.data.train_split = "train"
  config.data.eval_split = "val"
  config.data.test_split = "test2016"   # "" to skip the final test evaluation
  config.data.eval_dataset = ""         # dataset of eval_split if not `dataset` (TFDS name)
  config.data.test_dataset = ""         # dataset of test_split if not `dataset` (TFDS name)
  config.data.cache_dir = ""            # prepared TFDS data; "" = ~/.cache/transformer_jax/tfds
  config.data.tokenizer_path = ""       # "" = <workdir>/spm.model, trained on first use
  config.data.tokenizer_max_sentences = 1_000_000  # tokenizer trained on a sample of sentences
  config.data.tokenizer_max_chars = 0   # ... of at most this many characters; 0 = no limit
  config.data.max_source_length = 64    # tokens (EOS included); longer pairs are dropped
  config.data.max_target_length = 64
  config.data.batch_size = 64           # packed rows of 64 tokens per side: ~7k real tokens
  config.data.num_threads = 2
  config.data.prefetch_buffer_size = 64
  config.data.pretokenize = True        # ids tokenized once, cached by corpus + tokenizer
  config.data.num_workers = 0           # grain worker processes packing batches; 0 = in-process
  # Several training corpora mixed by weight, each NAME = ConfigDict(dataset=, data_dir=,
  # source_lang=, target_lang=, split=, weight=, tag=, eval_split=, test_split=) ("" = the
  # key above); empty = the one corpus above. configs/multilingual.py shows one.
  config.data.corpora = ml_collections.ConfigDict()
  # Rules dropping training pairs of a local corpus when it is prepared (0/False = off), each
  # counted, with examples, in cleaning.json beside the prepared data.
  config.data.cleaning = ml_collections.ConfigDict(dict(
      empty=False, max_words=0, max_length_ratio=0.0, identical=False, duplicates=False,
      min_letter_fraction=0.0, examples=3))
  # Subword regularization: each training pair segmented anew at every epoch by SentencePiece's
  # sampling, P(segmentation)^alpha over the lattice (nbest_size -1) or its n best; 0 = off.
  config.data.subword_sampling = ml_collections.ConfigDict(dict(alpha=0.0, nbest_size=-1))

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.learning_rate = 3e-3  # peak (the recipe search: 3e-3 beat 2e-3 by 1.3 BLEU)
  config.optimizer.warmup_steps = 100   # (100 learns faster than 200 in a short, time-limited
                                        # run, the same test BLEU in 1,000 steps)
  config.optimizer.schedule = "inverse_sqrt"  # after warmup; or "cosine", "linear", "constant"
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-9
  config.optimizer.weight_decay = 0.0
  config.optimizer.weight_decay_exclude = ("*bias", "*scale")  # not decayed: biases, norm scales
  config.optimizer.grad_clip_norm = 1.0
  config.optimizer.ema_decay = 0.999    # > 0: validate/translate with the EMA; 0 = off
  config.optimizer.cooldown_fraction = 0.2  # LR linear to 0 over the last 20% of the steps, or
                                            # of the time budget when that ends training first

  config.decode = ml_collections.ConfigDict()
  config.decode.beam_size = 4
  config.decode.length_penalty = 0.6    # GNMT alpha
  config.decode.max_length = 128        # absolute cap on generated tokens
  config.decode.max_length_a = 1.5      # and at most a * source_length + b
  config.decode.max_length_b = 10
  config.decode.batch_size = 128        # sentences per decode batch
  config.decode.num_samples_to_log = 3
  config.decode.greedy = False          # argmax decoding instead of beam search
  config.decode.sampling = False        # ancestral sampling instead of beam search
  config.decode.temperature = 1.0       # sampling: logits / temperature
  config.decode.top_k = 0               # sampling: k most likely tokens only (0 = all)
  config.decode.top_p = 1.0             # sampling: nucleus probability mass
  config.decode.seed = 0                # sampling: random seed
  config.decode.nbest = 1               # beam search: hypotheses returned per sentence
  config.decode.min_length = 0          # beam search: no EOS before this many tokens
  config.decode.slots = 0               # sentences decoded at once, in flight (0: auto)
  config.decode.beam_impl = "auto"      # beam search: "gather" reorders each hypothesis's
                                        # cache, "flat" shares a sentence's (same outputs);
                                        # auto: flat (faster on a CPU and a GPU measured)
  config.decode.mbr = ""                # "chrf" / "bleu": minimum-Bayes-risk choice of the output
  config.decode.mbr_candidates = 4      # mbr: n-best of the beam (<= beam_size), or samples
  config.decode.no_repeat_ngram_size = 0  # no n-gram of this size twice in a translation; 0 = off
  config.decode.repetition_penalty = 1.0  # > 1: logits of tokens already chosen shrink; 1 = off

  # Fine-tuning: start from another run's weights (fresh optimizer, step 0, its tokenizer);
  # checkpoint as `evaluate --checkpoint` takes it: best, latest, a step, average:N (+ :raw).
  config.init_from = ml_collections.ConfigDict(dict(workdir="", checkpoint="best"))

  config.parallelism = ml_collections.ConfigDict()
  config.parallelism.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 = all other devices
  # Logical parameter axis -> mesh axis (None: replicated): d_model over fsdp (FSDP), heads,
  # FFN width and vocabulary over tensor (tensor parallelism). The mesh shape picks the
  # strategy: (-1, 1, 1) data parallel, (2, -1, 1) FSDP in groups, (-1, 1, 2) 2-way tensor.
  config.parallelism.axis_rules = (
      ("embed", "fsdp"), ("vocab", "tensor"), ("heads", "tensor"), ("mlp", "tensor"),
      ("kv", None), ("layers", None))
  # A population: K members trained as one program on the same batches, each with its own
  # values of these keys (a tuple of K each; () = the run's value) or seeds=N (seed + i).
  # Each member is written as a workdir of its own, <workdir>/members/<i>/ (docs/guides/sweeps.md).
  config.population = ml_collections.ConfigDict(dict(
      seeds=0, seed=(), learning_rate=(), warmup_steps=(), b1=(), b2=(), eps=(),
      weight_decay=(), grad_clip_norm=(), ema_decay=(), label_smoothing=(), dropout_rate=(),
      attention_dropout_rate=(), ffn_dropout_rate=(),
      # "vmapped", "unrolled": how the members make one program (docs/guides/sweeps.md)
      program="auto"))
  return config
