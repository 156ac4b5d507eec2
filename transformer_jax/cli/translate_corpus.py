r"""Translates a text file into a parallel corpus folder: back-translation or distillation.

  # back-translation: an en->de run turns English monolingual text into (synthetic de, en)
  transformer-jax-translate-corpus --workdir=runs/ende --checkpoint=best \
      --input=mono.en.gz --out=data/bt --tag='<BT>' --decode=sampling=true --decode=top_k=10
  # distillation: a de->en teacher (an ensemble: --workdir repeated) on a corpus's German side
  transformer-jax-translate-corpus --workdir=runs/t1 --workdir=runs/t2 \
      --input=data/wmt/train.de --out=data/distilled

The folder gets {split}.{L1} (the input) and {split}.{L2} (its translations), line-aligned
(an empty, non-UTF-8 or over-long line: an empty pair, counted), and translation.json (model,
checkpoint, decoding settings, counts, tag). A killed run rerun with the same command goes on
where it stopped; the result equals an uninterrupted run's. Use the folder as a corpus of a
mixture: config.data.corpora.NAME = dict(data_dir=FOLDER, tag=TAG, ...).
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.inference.corpus_translation import translate_corpus as run
from transformer_jax.interop import engines
from transformer_jax.workdir import lock


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_multi_string("workdir", None, "A training workdir; several: an ensemble (one "
                            "tokenizer).", flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N | steps:A,B,... "
                      "[:ema | :raw]", flag_values=fv)
  flags.DEFINE_string("input", None, "Text to translate, one sentence per line (.gz too).",
                      flag_values=fv, required=True)
  flags.DEFINE_string("out", None, "The parallel folder written (resumed if it holds a "
                      "killed run of the same command).", flag_values=fv, required=True)
  flags.DEFINE_string("split", "train", "Split name of the files written.", flag_values=fv)
  flags.DEFINE_string("tag", "<BT>", "Tag recorded for the corpus in a mixture ('' = none).",
                      flag_values=fv)
  flags.DEFINE_integer("block_lines", 0, "Lines per block: the unit of progress and of "
                       "resuming (0: about a twentieth of the input, 64 to 2,048).",
                       lower_bound=0, flag_values=fv)
  runner.define_engine_flags(fv)
  runner.define_decoding_flags(fv)
  flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size, sampling, "
                            "top_k, top_p, temperature, seed, ...); repeatable.", flag_values=fv)


def translate_corpus(args: runner.Args):
  with lock.hold(args.out, "translate-corpus"):  # (one writer of the output folder)
    translator = engines.translator(args.engine, args.workdir, args.checkpoint, args.decode,
                                   args.source_tag, args.dtype, args.compute_type)
    run(translator, args.workdir, args.checkpoint, args.input, args.out, args.split, args.tag,
        args.block_lines)


def main(argv=None):
  runner.main("translate-corpus", __doc__, define_flags, translate_corpus, argv,
              stop_on_sigterm=True)


if __name__ == "__main__":
  main()
