r"""A TPE search over the default config's optimisation and regularisation settings.

  transformer-jax-sweep --config=configs/default.py \
      --sweep=configs/sweeps/default_tpe.py --workdir=runs/sweep_default

20 trials of the default config, each 1,200 steps (fixed: the default plans its length from the
machine's speed, and trials compare at one length), scored by the last validation BLEU; median
pruning after 4 finished trials, from step 500.
"""

from transformer_jax.config.search_space import choice, loguniform, new_spec, uniform


def get_config():
  sweep = new_spec()
  sweep.search_space = {
      "optimizer": {"learning_rate": loguniform(5e-4, 5e-3),
                    "warmup_steps": choice(100, 200, 400)},
      "model": {"dropout_rate": uniform(0.0, 0.3)},
      "label_smoothing": uniform(0.0, 0.2),
  }
  sweep.fixed = {"num_train_steps": 1200}  # (trials compare at one length, not planned each)
  sweep.objective = "eval/bleu"
  sweep.sampler = "tpe"
  sweep.num_trials = 20
  sweep.pruner = "median"
  sweep.pruner_startup_trials = 4
  sweep.pruner_warmup_steps = 500
  return sweep
