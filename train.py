r"""Trains a Transformer from a config file (the same as `transformer-jax-train`).

  python train.py --config=configs/default.py --workdir=runs/default \
      [--config.optimizer.learning_rate=1e-3 ...]

Re-running the same command resumes from the newest checkpoint in the workdir.
"""

from transformer_jax.cli.train import main

if __name__ == "__main__":
  main()
