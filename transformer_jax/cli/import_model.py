r"""Imports a model trained elsewhere as a workdir that every tool takes as a trained run
(evaluate, translate, average, export, attention maps; config.init_from to fine-tune it).

  transformer-jax-import --from=hf-marian --model_dir=opus-mt-en-de --workdir=runs/opus_en_de

hf-marian: a Hugging Face Marian folder (the OPUS-MT models: config.json, model.safetensors or
pytorch_model.bin (needs torch), source.spm, target.spm, vocab.json). The languages default
to those of an `opus-mt-SRC-TGT` folder name. Anything the model has that this code does not
compute is refused, named.
"""

import re
from pathlib import Path

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.errors import UsageError
from transformer_jax.interop import hf_marian

FORMATS = ("hf-marian",)


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_enum("from", None, FORMATS, "The model's format.", flag_values=fv,
                    required=True)
  flags.DEFINE_string("model_dir", None, "The model's folder.", flag_values=fv, required=True)
  flags.DEFINE_string("workdir", None, "The workdir written (a new folder).", flag_values=fv,
                      required=True)
  flags.DEFINE_string("source_lang", "", "Source language code (default: from an "
                      "opus-mt-SRC-TGT folder name).", flag_values=fv)
  flags.DEFINE_string("target_lang", "", "Target language code (likewise).", flag_values=fv)


def languages(args: runner.Args) -> tuple[str, str]:
  named = re.fullmatch(r"opus-mt-([a-z]+)-([a-z]+)", Path(args.model_dir).name)
  source = args.source_lang or (named.group(1) if named else "")
  target = args.target_lang or (named.group(2) if named else "")
  if not (source and target):
    raise UsageError("--source_lang and --target_lang are needed (the folder name "
                     f"{Path(args.model_dir).name!r} is not opus-mt-SRC-TGT)")
  return source, target


def run(args: runner.Args):
  source, target = languages(args)
  workdir = hf_marian.import_run(args.model_dir, args.workdir, source, target)
  print(f"imported {args.model_dir} ({getattr(args, 'from')}, {source}->{target}) -> {workdir}")


def main(argv=None):
  runner.main("import", __doc__, define_flags, run, argv)


if __name__ == "__main__":
  main()
