r"""Scores checkpoints of a trained run with sacreBLEU and chrF, side by side.

  transformer-jax-evaluate --workdir=runs/default [--split=test2016]
      [--checkpoint=latest|best|all|STEP|average:N|steps:A,B ...] [--decode=beam_size=5 ...]
  transformer-jax-evaluate --workdir=runs/default --source_file=newstest.de \
      --reference_file=newstest.en [--engine=jax,ctranslate2]   # engines side by side
Writes <workdir>/eval/<set>/<checkpoint>.hyp (--alignments: and .align) and adds to
results.json there (a set per direction of a multilingual run; --checkpoint=all: a plot).
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.inference.checkpoint_eval import (
  evaluate_checkpoints,
  format_table,
  writing_lock,
)
from transformer_jax.interop import engines


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_multi_string("workdir", None, "A training workdir; several: an ensemble (one "
                            "tokenizer; results go to the first's eval/).", flag_values=fv,
                            required=True)
  flags.DEFINE_string("split", "", "A split, or NAME.SPLIT of a mixture's corpus (default: "
                      "the test split and each corpus's).", flag_values=fv)
  flags.DEFINE_multi_string("checkpoint", ["latest"], "latest | best | all | STEP | average:N "
                            "| steps:A,B,... [:ema | :raw]; repeatable", flag_values=fv)
  flags.DEFINE_string("source_file", "", "Score on this source text file (with "
                      "--reference_file) instead of a split.", flag_values=fv)
  flags.DEFINE_string("reference_file", "", "The references of --source_file.", flag_values=fv)
  flags.DEFINE_integer("max_sentences", 0, "Only the first N sentences (0 = all).", flag_values=fv)
  flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size, "
                            "length_penalty, nbest, greedy, ...); repeatable.", flag_values=fv)
  flags.DEFINE_bool("lowercase", False, "Also report lowercased BLEU.", flag_values=fv)
  flags.DEFINE_bool("alignments", False, "Also write word alignments.", flag_values=fv)
  runner.define_decoding_flags(fv)
  flags.DEFINE_list("engine", ["jax"], "jax and/or ctranslate2: a result each.", flag_values=fv)
  flags.DEFINE_string("compute_type", "", "ctranslate2's (default: by hardware).", flag_values=fv)
  flags.DEFINE_string("output_dir", "", "Where to write (default <workdir>/eval/<set>).",
                      flag_values=fv)


def evaluate(args: runner.Args):
  chosen = engines.evaluation_engines(args.engine, args.compute_type, args.dtype)
  with writing_lock(args.workdir[0], args.output_dir):
    results, out_dirs = evaluate_checkpoints(
        args.workdir, args.split, args.checkpoint, args.source_file, args.reference_file,
        args.max_sentences, args.decode, args.lowercase, args.output_dir, args.alignments,
        args.source_tag, args.dtype, chosen)
  print(format_table(results), *(f"wrote {d}/results.json" for d in out_dirs), sep="\n")


def main(argv=None):
  runner.main("evaluate", __doc__, define_flags, evaluate, argv)


if __name__ == "__main__":
  main()
