r"""Is a system's difference from a baseline on a test set more than chance? sacreBLEU's paired
bootstrap resampling (default) or paired approximate randomization, for runs and populations.

  transformer-jax-compare --baseline=runs/base --system=runs/new [--set=test2016]
  transformer-jax-compare --baseline=runs/seeds_a --system=runs/seeds_b   # populations
  transformer-jax-compare --baseline=a.hyp --system=b.hyp --reference=ref.txt --test=ar

A system is a hypothesis file (several, comma-separated: a population by hand), a run's
workdir (its translations in eval/<set>/, as evaluate and training's test write them: the
last evaluated unless --label names one) or a population's (each member's). Runs are compared
alike: each run's translations are those made as the first run's were (engine, checkpoint
selection and weights, steps aside, decoding settings), else it is refused naming what
differs. A population is scored on its members' translations pooled. Prints what was compared
and, per metric, the score, bootstrap mean ± 95% interval and each system's p-value.
"""

import json

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.evaluation import significance  # (its defaults)
from transformer_jax.inference import compared


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("baseline", None, "Hypothesis file(s), a run's or a population's "
                      "workdir.", flag_values=fv, required=True)
  flags.DEFINE_multi_string("system", None, "The same, compared with the baseline; "
                            "repeatable.", flag_values=fv, required=True)
  flags.DEFINE_string("reference", "", "The references (default: the set's, from the first "
                      "run's data).", flag_values=fv)
  flags.DEFINE_string("set", "", "The set in eval/ (default: the only one).", flag_values=fv)
  flags.DEFINE_string("label", "", "The translations in eval/<set>/ (e.g. step_1200_ema; "
                      "default: the last evaluated alike).", flag_values=fv)
  flags.DEFINE_enum("test", "bs", ["bs", "ar"], "Paired bootstrap resampling or approximate "
                    "randomization.", flag_values=fv)
  flags.DEFINE_integer("samples", 0, "Resamples (bs) or trials (ar); 0: sacreBLEU's 1000 or "
                       "10000.", flag_values=fv)
  flags.DEFINE_integer("seed", significance.DEFAULT_SEED, "The generator's seed "
                       "(sacreBLEU's SACREBLEU_SEED).", flag_values=fv)
  flags.DEFINE_string("json", "", "Also write the results as JSON here.", flag_values=fv)


def compare(args: runner.Args):
  baseline, *systems = compared.systems([args.baseline, *args.system], args.set, args.label)
  refs = compared.references(args.reference, [baseline, *systems], args.set)
  lines, report = compared.tested(baseline, systems, refs, args.test, args.samples, args.seed)
  print("\n".join(lines))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)


def main(argv=None):
  runner.main("compare", __doc__, define_flags, compare, argv)


if __name__ == "__main__":
  main()
