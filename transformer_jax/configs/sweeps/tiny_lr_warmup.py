r"""Learning rate × warmup on the tiny config: a 3 × 2 grid scored by validation loss.

  transformer-jax-sweep --config=configs/tiny.py \
      --sweep=configs/sweeps/tiny_lr_warmup.py --workdir=runs/sweep_tiny

Six trials of 30 steps each; a few minutes on 2 CPU cores. Median pruning stops a trial
whose validation loss at step 10 or 20 is worse than the median of the finished trials there.
"""

from transformer_jax.config.search_space import choice, new_spec


def get_config():
  sweep = new_spec()
  sweep.search_space = {"optimizer": {"learning_rate": choice(1e-2, 3e-3, 1e-3),
                                      "warmup_steps": choice(5, 15)}}
  sweep.fixed = {"num_train_steps": 30, "eval_every_steps": 10, "checkpoint_every_steps": 10}
  sweep.objective = "eval/loss"
  sweep.sampler = "grid"
  sweep.pruner = "median"
  sweep.pruner_startup_trials = 2
  return sweep
