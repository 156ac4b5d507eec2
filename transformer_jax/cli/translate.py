r"""Translates text with a trained run: stdin or a file in, stdout or a file out.

  echo "Ein Hund läuft im Schnee." | transformer-jax-translate --workdir=runs/default
  transformer-jax-translate --workdir=runs/default --input=in.de --output=out.en \
      [--checkpoint=best] [--decode=beam_size=5 --decode=nbest=4] [--prefix_file=prefixes.en]
  transformer-jax-translate --workdir=runs/seed1 --workdir=runs/seed2 ...   # an ensemble
  transformer-jax-translate --workdir=runs/default --source_tag='>>de<<'    # a tagged run
One output line per input line (gzipped input too), in order; an empty line gives an empty line.
Input is batched by length; on a terminal (or with --interactive) each line is translated as
it is entered. With nbest > 1 each input gives `nbest` lines `INDEX ||| translation ||| score`;
--alignments adds ` ||| ALIGNMENT` to each (Pharaoh `i-j` pairs: source word i, target word j).
"""

import sys

from absl import flags

from transformer_jax import atomic
from transformer_jax.cli import runner
from transformer_jax.data.text import iter_lines, read_lines
from transformer_jax.inference.translator import Translator


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_multi_string("workdir", None, "A training workdir; several: an ensemble (one "
                            "tokenizer).", flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N | steps:A,B,... "
                      "[:ema | :raw]", flag_values=fv)
  flags.DEFINE_string("input", "-", "Input text ('-' = stdin).", flag_values=fv)
  flags.DEFINE_string("output", "-", "Output file ('-' = stdout).", flag_values=fv)
  flags.DEFINE_string("prefix_file", "", "Target prefixes, one per input line (empty: none): "
                      "each translation starts with its prefix.", flag_values=fv)
  flags.DEFINE_string("source_tag", "", "A tag put before every source.", flag_values=fv)
  flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size, nbest, "
                            "greedy, sampling, temperature, ...); repeatable.", flag_values=fv)
  flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16", "auto"], "The matmuls' dtype "
                    "(default: the run's; a run trained in bf16, this machine's choice).",
                    flag_values=fv)
  flags.DEFINE_bool("interactive", None, "Translate line by line as input arrives (default: "
                    "when stdin is a terminal).", flag_values=fv)
  flags.DEFINE_bool("alignments", False, "Word alignments (cross-attention).", flag_values=fv)
  flags.DEFINE_integer("alignment_layer", None, "Their decoder layer (default: penultimate).",
                       flag_values=fv)


def translate(args: runner.Args):
  from_stdin = args.input == "-"
  interactive = from_stdin and sys.stdin.isatty() if args.interactive is None else args.interactive
  translator = Translator(args.workdir, args.checkpoint, args.decode, args.source_tag,
                          args.dtype, args.alignments, args.alignment_layer)
  lines = iter_lines(sys.stdin.buffer, "<stdin>") if from_stdin else read_lines(args.input)
  prefixes = list(read_lines(args.prefix_file)) if args.prefix_file else None
  if args.output == "-":
    translator.translate_lines(lines, sys.stdout, interactive, prefixes)
  elif interactive:  # (a session's record: each line as it is translated)
    with open(args.output, "w", encoding="utf-8") as out:
      translator.translate_lines(lines, out, interactive, prefixes)
  else:  # (the whole file or none: a temporary beside it, renamed when complete)
    with atomic.replacing(args.output) as tmp, open(tmp, "w", encoding="utf-8") as out:
      translator.translate_lines(lines, out, interactive, prefixes)


def main(argv=None):
  runner.main("translate", __doc__, define_flags, translate, argv)


if __name__ == "__main__":
  main()
