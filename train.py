"""Trains a Transformer from an ml_collections config file.

  python train.py --config=configs/default.py --workdir=runs/default \
      [--config.optimizer.learning_rate=1e-3 ...]

Re-running the same command resumes from the latest checkpoint in the workdir.
"""

import logging as std_logging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Folder for checkpoints, metrics, tokenizer and outputs.")
flags.DEFINE_string("jax_platforms", None, "Override JAX_PLATFORMS (e.g. cpu).")
flags.DEFINE_string("coordinator_address", None,
                    "Multi-host: host:port of process 0 (jax.distributed.initialize).")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: index of this process.")
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.jax_platforms:
    os.environ["JAX_PLATFORMS"] = FLAGS.jax_platforms
  from transformer_jax import config as config_lib, sharding, train_lib  # after flags: JAX env

  _setup_logging()

  sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                  FLAGS.process_id)
  try:
    cfg = config_lib.from_config_dict(FLAGS.config)
    train_lib.train_and_evaluate(cfg, FLAGS.workdir, FLAGS.config.to_dict())
  except config_lib.ConfigError as e:  # (raised before anything is compiled or saved)
    logging.error("%s", e)
    sys.exit(f"config error: {e}")


def _setup_logging():
  """Our own progress at INFO on stderr; library chatter (Orbax, TFDS) only from WARNING up,
  unless --verbosity asks for more."""
  handler = std_logging.StreamHandler(sys.stderr)
  handler.setFormatter(std_logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
  ours = std_logging.getLogger("transformer_jax")
  ours.setLevel(std_logging.INFO)
  ours.addHandler(handler)
  ours.propagate = False
  if FLAGS.verbosity <= 0:  # absl default: show only warnings from libraries
    logging.set_verbosity(logging.WARNING)


if __name__ == "__main__":
  app.run(main)
