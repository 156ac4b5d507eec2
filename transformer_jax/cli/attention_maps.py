r"""Attention maps of a trained run: which source subwords each target subword attends to.

  transformer-jax-attention-maps --workdir=runs/default \
      --sentence="Ein Mann fährt Fahrrad." [--translation="A man rides a bike."]

Writes <workdir>/attention/<kind>_layer<i>.png for the encoder self-attention, the decoder's
masked self-attention and the encoder–decoder (cross) attention: one heatmap per head, rows
the attending (query) subwords, columns the attended (key) subwords. Without --translation the
model's own translation is used.
"""

import contextlib
from pathlib import Path

from absl import flags

from transformer_jax.cli import runner
from transformer_jax.errors import UsageError
from transformer_jax.evaluation.attention_maps import attention_weights, plot_attention
from transformer_jax.inference.translator import Translator
from transformer_jax.workdir import lock


def define_flags(fv: flags.FlagValues):
  flags.DEFINE_string("workdir", None, "A training workdir.", flag_values=fv, required=True)
  flags.DEFINE_string("sentence", None, "The source sentence.", flag_values=fv, required=True)
  flags.DEFINE_string("translation", "", "Its translation (default: the model's own).",
                      flag_values=fv)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N",
                      flag_values=fv)
  flags.DEFINE_string("output_dir", "", "Where to write (default <workdir>/attention).",
                      flag_values=fv)


def attention_maps(args: runner.Args):
  if not args.sentence.strip():
    raise UsageError("--sentence is empty")
  translator = Translator(args.workdir, args.checkpoint)
  translation = args.translation or translator.translate([args.sentence])[0][0][0]
  tokenizer = translator.run.tokenizer
  source_ids, target_ids = tokenizer.encode(args.sentence), tokenizer.encode(translation, "target")
  weights = attention_weights(translator.run.model, translator.params, source_ids, target_ids)
  out_dir = Path(args.output_dir or Path(args.workdir) / "attention")
  with lock.hold(args.workdir, "attention-maps") if not args.output_dir else (
      contextlib.nullcontext()):
    paths = plot_attention(weights, tokenizer.pieces(source_ids),
                           tokenizer.pieces(target_ids), out_dir)
  print(f"source: {args.sentence}\ntranslation: {translation}")
  print("\n".join(str(p) for p in paths))


def main(argv=None):
  runner.main("attention_maps", __doc__, define_flags, attention_maps, argv)


if __name__ == "__main__":
  main()
