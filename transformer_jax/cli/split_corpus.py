r"""Writes a leak-free train/dev/test folder from sentence pairs without a split.

  transformer-jax-split-corpus --pairs=FILE[,FILE...] --columns=en,de --out=DIR \
      [--group_by=en] [--dev_fraction=0.01] [--seed=0] [--test=de=FILE,en=FILE] \
      [--dedup_test_by=de] [--exclude=FILE,...]

The rules (grouping, test-set removal, deduplication): transformer_jax/data/splitting.py.
"""

import json
from pathlib import Path

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.data.splitting import parse_language_files, split_corpus


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_list("pairs", None, "Tab-separated pair files (plain or .gz), one pair per line, "
                    "columns as --columns.", flag_values=fv, required=True)
  flags.DEFINE_list("columns", ["en", "de"], "The language of each --pairs column.",
                    flag_values=fv)
  flags.DEFINE_string("group_by", "", "Language whose sentence decides the split of all its "
                      "pairs; default: the first column.", flag_values=fv)
  flags.DEFINE_float("dev_fraction", 0.01, "Share of group_by sentences (with all their "
                     "pairs) held out as the dev split.", flag_values=fv)
  flags.DEFINE_string("test", "", "The test set: lang=file,lang=file (line-aligned).",
                      flag_values=fv)
  flags.DEFINE_string("dedup_test_by", "", "Keep one test pair per sentence of this language; "
                      "default: drop identical pairs only.", flag_values=fv)
  flags.DEFINE_list("exclude", [], "More files (one sentence per line) whose sentences are "
                    "removed from train and dev, e.g. older test-set versions.", flag_values=fv)
  flags.DEFINE_integer("seed", 0, "Changes which sentences go to dev.", flag_values=fv)
  flags.DEFINE_string("out", None, "Output folder.", flag_values=fv, required=True)


def split(args: runner.Args):
  report = split_corpus(
      [Path(p) for p in args.pairs], args.columns, Path(args.out), group_by=args.group_by,
      dev_fraction=args.dev_fraction, test=parse_language_files(args.test),
      dedup_test_by=args.dedup_test_by, exclude=[Path(p) for p in args.exclude],
      seed=args.seed)
  print(json.dumps(report["counts"]))


def main(argv=None):
  runner.main("split_corpus", __doc__, define_flags, split, argv)


if __name__ == "__main__":
  main()
