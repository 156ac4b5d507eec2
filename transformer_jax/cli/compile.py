r"""Compiles a run's programs for an accelerator this machine does not have, and says what it
takes: memory per chip against its HBM, FLOPs and predicted time per step, MFU, collectives.

  transformer-jax-compile --config=configs/wmt_base.py --target=v5p-8 [--config.KEY=VALUE ...]

Targets: Cloud TPU slices (v4-8, v5e-8, v5p-8, v6e-8, ...; --slices=N joins N of them), whose
devices libtpu describes on any machine: pip install 'transformer_jax[tpu]'; one host of NVIDIA
GPUs (a100-8, h100-8, h200-1, ...), for XLA's CUDA compiler: '[gpu-compile]'. The programs are
those a run executes (the train step, the validation loss step, beam search's start and loop),
partitioned over the config's mesh. A program that does not fit its chip: exit status 1 and a
line naming the shortfall and the levers. --json=PATH writes every figure.
"""

from pathlib import Path

from absl import flags

from transformer_jax import errors
from transformer_jax.aot import check, report, targets
from transformer_jax.cli import runner
from transformer_jax.config.parse import from_config_dict


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("target", None, f"The accelerator: {', '.join(targets.NAMES)}.",
                      flag_values=fv, required=True)
  flags.DEFINE_integer("slices", 1, "TPU slices joined by the data-center network.",
                       flag_values=fv)
  flags.DEFINE_string("programs", ",".join(check.PROGRAMS), "Which programs to compile: "
                      f"{', '.join(check.PROGRAMS)} (comma-separated).", flag_values=fv)
  flags.DEFINE_string("json", "", "Write the reports as JSON to this file.", flag_values=fv)
  flags.DEFINE_string("hlo_dir", "", "Write each program's optimised HLO into this folder.",
                      flag_values=fv)


def run(args: runner.Args):
  cfg = from_config_dict(args.configs["config"])
  target = targets.target(args.target, args.slices)
  which = check.selected(args.programs)
  print(f"compiling for {targets.describe(target)}", flush=True)
  reports = check.check(cfg, target, which,
                        on_report=lambda r: print("\n".join(report.lines(r)), flush=True),
                        hlo_dir=Path(args.hlo_dir) if args.hlo_dir else None)
  if args.json:
    given = [f"--{name}={getattr(args, name)}" for name in ("target", "slices", "programs")]
    report.write_json(args.json, target, ["transformer-jax-compile",
                                          *args.config_args["config"], *given], reports)
  refusals = [line for r in reports
              if (line := report.refusal(r, check.levers(cfg, r.program)))]
  if refusals:
    raise errors.Error(refusals[0])


def main(argv=None):
  runner.main("compile", __doc__, define_flags, run, argv,
              configs={"config": "Training config file (configs/*.py)"})


if __name__ == "__main__":
  main()
