r"""Runs (or joins) a hyperparameter sweep with Optuna: every trial is an ordinary training run.

  transformer-jax-sweep --config=configs/tiny.py --sweep=configs/sweeps/tiny_lr_warmup.py \
      --workdir=runs/sweep_tiny [--config.num_train_steps=40 ...] [--sweep.num_trials=12 ...] \
      [--storage=postgresql+psycopg2://user@host/db] [--devices=0,1]

The study lives in Optuna storage (default: SQLite <workdir>/study.db); rerunning the same
command continues it, and more workers (processes, machines) with the same --storage share it.
How trials are claimed, retried and reported: transformer_jax/sweeps/.
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.sweeps.worker import WorkerOptions, run_sweep


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "Sweep folder: trials/, results, plots, the SQLite "
                      "study.", flag_values=fv, required=True)
  flags.DEFINE_string("storage", "", "Optuna storage URL shared by all workers; default "
                      "sqlite:///<workdir>/study.db.", flag_values=fv)
  flags.DEFINE_string("study_name", "", "Study name in the storage; default: the sweep "
                      "file's name.", flag_values=fv)
  flags.DEFINE_string("devices", "", "Pin this worker's trials to these accelerators "
                      "(CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES), e.g. 0,1.", flag_values=fv)
  flags.DEFINE_integer("heartbeat_interval", 10, "Seconds between a running trial's "
                       "heartbeats.", flag_values=fv)
  flags.DEFINE_integer("heartbeat_grace", 60, "A running trial whose heartbeat is older than "
                       "this is taken to be dead: failed, and rerun from its checkpoint.",
                       flag_values=fv)
  flags.DEFINE_bool("report_only", False, "Only rewrite the results table and plots.",
                    flag_values=fv)


def sweep(args: runner.Args):
  options = WorkerOptions(args.workdir, args.storage, args.study_name, args.devices,
                          args.heartbeat_interval, args.heartbeat_grace, args.report_only)
  print(run_sweep(args.configs["sweep"], args.sweep, args.configs["config"],
                  args.config_args["config"], options), flush=True)


def main(argv=None):
  runner.main("sweep", __doc__, define_flags, sweep, argv,
              configs={"config": "Base training config (configs/*.py), for every trial",
                       "sweep": "Sweep spec (configs/sweeps/*.py)"})


if __name__ == "__main__":
  main()
