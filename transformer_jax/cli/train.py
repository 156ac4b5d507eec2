r"""Trains a Transformer from a config file; the run lives in --workdir.

  transformer-jax-train --config=configs/default.py --workdir=runs/default \
      [--config.optimizer.learning_rate=1e-3 ...]          (or: python train.py ...)

Re-running the same command resumes from the newest checkpoint in the workdir. Several hosts:
the same command on each, with --coordinator_address, --num_processes and --process_id.
"""

import jax
from absl import flags

from transformer_jax.cli import runner
from transformer_jax.config.parse import from_config_dict
from transformer_jax.parallel.distributed import initialize_distributed
from transformer_jax.training.loop import train_and_evaluate


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "Folder for checkpoints, metrics, tokenizer and outputs.",
                      flag_values=fv, required=True)
  flags.DEFINE_float("wait_for_workdir", 0.0, "Seconds to wait for another process writing "
                     "the workdir to finish (0: stop at once with its pid).", flag_values=fv)
  flags.DEFINE_string("jax_platforms", None, "JAX backends to use (e.g. cpu).", flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 "
                      "(jax.distributed.initialize).", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "Multi-host: index of this process.", flag_values=fv)


def train(args: runner.Args):
  cfg = from_config_dict(args.configs["config"])  # (checked before JAX starts)
  if args.jax_platforms:
    jax.config.update("jax_platforms", args.jax_platforms)
  initialize_distributed(args.coordinator_address, args.num_processes, args.process_id)
  train_and_evaluate(cfg, args.workdir, args.configs["config"].to_dict(), args.wait_for_workdir)


def main(argv=None):
  runner.main("train", __doc__, define_flags, train, argv,
              configs={"config": "Training config file (configs/*.py)"})


if __name__ == "__main__":
  main()
