"""Trains a Transformer from an ml_collections config file.

  python train.py --config=configs/default.py --workdir=runs/default \
      [--config.optimizer.learning_rate=1e-3 ...]

Re-running the same command resumes from the latest checkpoint in the workdir.
"""

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
  # (imported after flags: they set the JAX environment)
  from transformer_jax import checkpoints, config as config_lib, corpus, sharding, train_lib

  _setup_logging()

  sharding.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                  FLAGS.process_id)
  try:
    cfg = config_lib.from_config_dict(FLAGS.config)
    train_lib.train_and_evaluate(cfg, FLAGS.workdir, FLAGS.config.to_dict())
  except config_lib.ConfigError as e:  # (raised before anything is compiled or saved)
    logging.error("%s", e)
    sys.exit(f"config error: {e}")
  except (checkpoints.CheckpointError, corpus.DataError, train_lib.NonFiniteError) as e:
    logging.error("%s", e)  # (nothing saved is touched: the message says what to do)
    sys.exit(f"error: {e}")


def _setup_logging():
  """Our own progress at INFO on stderr; library chatter (Orbax, TFDS) only from WARNING up,
  unless --verbosity asks for more."""
  from transformer_jax import metrics
  metrics.log_to_stderr()
  metrics.quiet_libraries()


if __name__ == "__main__":
  app.run(main)
