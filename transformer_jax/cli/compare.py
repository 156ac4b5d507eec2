r"""Is a system's difference from a baseline on a test set more than chance? sacreBLEU's paired
bootstrap resampling (default) or paired approximate randomization, for runs and populations.

  transformer-jax-compare --baseline=runs/base --system=runs/new [--set=test2016]
  transformer-jax-compare --baseline=runs/seeds_a --system=runs/seeds_b   # populations
  transformer-jax-compare --baseline=a.hyp --system=b.hyp --reference=ref.txt --test=ar

A system is a hypothesis file (several, comma-separated: a population by hand), a run's
workdir (its translations in eval/<set>/, as evaluate and training's test write them: the
last evaluated unless --label names one) or a population's (each member's). A population is
scored on all its members' translations pooled, and its members' mean ± standard deviation
is printed beside (evaluation/significance.py). Prints, per metric: the score, the bootstrap
mean ± 95% interval and each system's p-value against the baseline.
"""

import json

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.evaluation import significance
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
                      "default: the last evaluated).", flag_values=fv)
  flags.DEFINE_enum("test", "bs", ["bs", "ar"], "Paired bootstrap resampling or approximate "
                    "randomization.", flag_values=fv)
  flags.DEFINE_integer("samples", 0, "Resamples (bs) or trials (ar); 0: sacreBLEU's 1000 or "
                       "10000.", flag_values=fv)
  flags.DEFINE_integer("seed", significance.DEFAULT_SEED, "The generator's seed "
                       "(sacreBLEU's SACREBLEU_SEED).", flag_values=fv)
  flags.DEFINE_string("json", "", "Also write the results as JSON here.", flag_values=fv)


def compare(args: runner.Args):
  baseline = compared.system(args.baseline, args.set, args.label)
  systems = [compared.system(s, args.set, args.label) for s in args.system]
  refs = compared.references(args.reference, [baseline, *systems], args.set)
  test = (significance.paired_bootstrap if args.test == "bs"
          else significance.paired_randomization)
  samples = args.samples or significance.DEFAULT_SAMPLES[args.test]
  rows, report = [], {"test": args.test, "samples": samples, "seed": args.seed, "systems": []}
  for i, system in enumerate(systems):
    results = test(baseline.members, system.members, refs, samples, args.seed)
    if i == 0:
      rows.append(_row(f"baseline: {baseline.name}", {m: r[0] for m, r in results.items()}))
      report["systems"].append(_record(baseline, {m: r[0] for m, r in results.items()}))
    rows.append(_row(system.name, {m: r[1] for m, r in results.items()}))
    report["systems"].append(_record(system, {m: r[1] for m, r in results.items()}))
  print(f"{'paired bootstrap resampling' if args.test == 'bs' else 'approximate randomization'}"
        f", {samples} {'resamples' if args.test == 'bs' else 'trials'}, seed {args.seed}, "
        f"{len(refs)} sentences; * p < 0.05")
  print("\n".join(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)


def _row(name: str, results: dict) -> str:
  cells = []
  for metric, r in results.items():
    cell = f"{metric} {r.score:.2f}"
    if r.mean is not None:
      cell += f" ({r.mean:.2f} ± {r.ci:.2f})"
    if len(r.members) > 1:
      cell += f" [{len(r.members)} members: {r.member_mean:.2f} ± {r.member_std:.2f}]"
    if r.p_value is not None:
      cell += f" p = {r.p_value:.4f}{'*' if r.p_value < 0.05 else ''}"
    cells.append(cell)
  return f"{name}: " + " | ".join(cells)


def _record(system, results: dict) -> dict:
  return {"name": system.name, "members": len(system.members), **{
      metric: {"score": r.score, "mean": r.mean, "ci": r.ci, "p_value": r.p_value,
               "member_scores": list(r.members), "member_mean": r.member_mean,
               "member_std": r.member_std} for metric, r in results.items()}}


def main(argv=None):
  runner.main("compare", __doc__, define_flags, compare, argv)


if __name__ == "__main__":
  main()
