r"""Averages checkpoints of a run into a new workdir that evaluate and translate use as it is.

  transformer-jax-average --workdir=runs/default --checkpoint=average:5 \
      --output=runs/default_avg5
  transformer-jax-evaluate --workdir=runs/default_avg5

The new workdir gets the run's config.json and tokenizer and one checkpoint, at the last
averaged step, whose parameters are the element-wise mean (optimizer state: the last one's).
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.inference.averaging import average_to_workdir
from transformer_jax.workdir import lock


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "A training workdir.", flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "average:5", "average:N (the last N) or steps:A,B,...",
                      flag_values=fv)
  flags.DEFINE_string("output", None, "New workdir for the averaged checkpoint.",
                      flag_values=fv, required=True)


def average(args: runner.Args):
  with lock.hold(args.output, "average"):
    step, steps = average_to_workdir(args.workdir, args.checkpoint, args.output)
  print(f"averaged steps {steps} -> {args.output}/checkpoints/{step}")


def main(argv=None):
  runner.main("average", __doc__, define_flags, average, argv)


if __name__ == "__main__":
  main()
