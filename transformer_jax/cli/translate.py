r"""Translates text with a trained run: stdin or a file in, stdout or a file out.

  echo "Ein Hund läuft im Schnee." | transformer-jax-translate --workdir=runs/default
  transformer-jax-translate --workdir=runs/default --input=in.de --output=out.en [--checkpoint=best]
  transformer-jax-translate --workdir=runs/seed1 --workdir=runs/seed2 ...   # an ensemble
  transformer-jax-translate --workdir=runs/default --source_tag='>>de<<' --engine=ctranslate2
One output line per input line (gzipped input too), in order, batched by length; on a
terminal (or with --interactive) each line as it is entered. nbest > 1: `nbest` lines `INDEX |||
translation ||| score` each; --alignments adds ` ||| ALIGNMENT` (Pharaoh `i-j` pairs).
"""

import contextlib
import sys

from absl import flags

from transformer_jax import atomic
from transformer_jax.cli import runner
from transformer_jax.data.text import iter_lines, read_lines
from transformer_jax.interop import engines


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_multi_string("workdir", None, "A training workdir; several: an ensemble (one "
                            "tokenizer).", flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N | steps:A,B,... "
                      "[:ema | :raw]", flag_values=fv)
  flags.DEFINE_string("input", "-", "Input text ('-' = stdin).", flag_values=fv)
  flags.DEFINE_string("output", "-", "Output file ('-' = stdout).", flag_values=fv)
  flags.DEFINE_string("prefix_file", "", "A translation prefix per input line.", flag_values=fv)
  runner.define_engine_flags(fv)
  runner.define_decoding_flags(fv)
  flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size=5, nbest=2, "
                            "sampling=true, ...); repeatable.", flag_values=fv)
  flags.DEFINE_bool("interactive", None, "Line by line as it comes (default: on a terminal).",
                    flag_values=fv)
  flags.DEFINE_bool("alignments", False, "Word alignments (cross-attention).", flag_values=fv)
  flags.DEFINE_integer("alignment_layer", None, "Their decoder layer (default: penultimate).",
                       flag_values=fv)


def translate(args: runner.Args):
  from_stdin = args.input == "-"
  interactive = from_stdin and sys.stdin.isatty() if args.interactive is None else args.interactive
  translator = engines.translator(args.engine, args.workdir, args.checkpoint, args.decode,
                                 args.source_tag, args.dtype, args.compute_type,
                                 args.alignments, args.alignment_layer)
  lines = iter_lines(sys.stdin.buffer, "<stdin>") if from_stdin else read_lines(args.input)
  prefixes = list(read_lines(args.prefix_file)) if args.prefix_file else None
  with (contextlib.nullcontext(sys.stdout) if args.output == "-"
        else atomic.text_file(args.output)) as out:  # (a file: whole or not at all)
    translator.translate_lines(lines, out, interactive, prefixes)


def main(argv=None):
  runner.main("translate", __doc__, define_flags, translate, argv)


if __name__ == "__main__":
  main()
