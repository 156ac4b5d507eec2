r"""Exports a trained run as a CTranslate2 model folder (int8/float16 serving on CPU and GPU).

  transformer-jax-export --workdir=runs/default --checkpoint=best --out=exported/default_int8 \
      --quantization=int8

The folder holds model.bin, config.json and the vocabulary (CTranslate2's), the run's
SentencePiece model (sentencepiece.model), export.json (run, checkpoint, steps, weights,
quantization, the run's decoding settings as translate_batch arguments) and a README of its
provenance and use. Every model option of this codebase converts exactly. Needs the extra
`ctranslate2` (pip install 'transformer_jax[ctranslate2]').
"""

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.interop.ctranslate2_export import QUANTIZATIONS, export


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "A training workdir.", flag_values=fv, required=True)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N | steps:A,B,... "
                      "[:ema | :raw] (one model; a run's moving average by default)",
                      flag_values=fv)
  flags.DEFINE_string("out", None, "The CTranslate2 model folder written.", flag_values=fv,
                      required=True)
  flags.DEFINE_string("quantization", "float32", f"Weight type: {' | '.join(QUANTIZATIONS)}.",
                      flag_values=fv)
  flags.DEFINE_bool("force", False, "Replace --out if it exists.", flag_values=fv)


def run(args: runner.Args):
  record = export(args.workdir, args.checkpoint, args.out, args.quantization, args.force)
  print(f"exported {record['checkpoint']} (steps {record['steps']}, {record['weights']} "
        f"weights, {record['quantization']}) -> {args.out}")


def main(argv=None):
  runner.main("export", __doc__, define_flags, run, argv)


if __name__ == "__main__":
  main()
