"""Attention maps: which source subwords each target subword attends to, per layer and head.

  python -m transformer_jax.attention_maps --workdir=runs/default \
      --sentence="Ein Mann fährt Fahrrad." [--translation="A man rides a bike."]

Writes `<workdir>/attention/<name>_layer<i>.png` for the encoder self-attention, the decoder's
masked self-attention and the encoder–decoder (cross) attention: one heatmap per head, rows
the attending (query) subwords, columns the attended (key) subwords. Without --translation the
model's own beam-search translation is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from absl import app, flags

from transformer_jax.metrics import quiet_libraries
from transformer_jax.model import unscanned

KINDS = {"encoder_self_attention": ("encoder", "self_attention"),
         "decoder_self_attention": ("decoder", "self_attention"),
         "cross_attention": ("decoder", "cross_attention")}


def attention_weights(model, params, source_ids, target_ids) -> dict[str, list[np.ndarray]]:
  """Teacher-forced attention weights for one pair: for each kind, a list over layers of
  (heads, queries, keys) arrays. Rows sum to 1 over visible keys; hidden cells are 0."""
  inputs = np.asarray(source_ids, np.int32)[None]
  targets = np.asarray(target_ids, np.int32)[None]
  model, params = unscanned(model, params)
  _, state = model.apply({"params": params}, inputs, targets, mutable=["intermediates"])
  inter = state["intermediates"]
  cfg = model.config
  out = {}
  for kind, (stack, module) in KINDS.items():
    layers = cfg.num_encoder_layers if stack == "encoder" else cfg.num_decoder_layers
    out[kind] = [np.asarray(inter[f"{stack}_{i}"][module]["attention_weights"][0][0])
                 for i in range(layers)]
  return out


def plot_attention(weights: dict[str, list[np.ndarray]], source_pieces: list[str],
                   target_pieces: list[str], out_dir: Path, prefix: str = "") -> list[Path]:
  """One PNG per kind and layer, a heatmap per head labelled with the subwords."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  out_dir.mkdir(parents=True, exist_ok=True)
  # The decoder reads the target shifted right: query t predicts target t from targets < t.
  labels = {"encoder_self_attention": (source_pieces, source_pieces),
            "decoder_self_attention": (target_pieces, ["<s>"] + target_pieces[:-1]),
            "cross_attention": (target_pieces, source_pieces)}
  paths = []
  for kind, layers in weights.items():
    rows, cols = labels[kind]
    for layer, w_HTS in enumerate(layers):
      heads = w_HTS.shape[0]
      size = max(3.0, 0.28 * max(len(rows), len(cols)))
      fig, axes = plt.subplots(1, heads, figsize=(size * heads, size), squeeze=False)
      for h, ax in enumerate(axes[0]):
        ax.imshow(w_HTS[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"head {h}")
      fig.suptitle(f"{kind.replace('_', ' ')}, layer {layer}")
      fig.tight_layout()
      path = out_dir / f"{prefix}{kind}_layer{layer}.png"
      fig.savefig(path, dpi=80)
      plt.close(fig)
      paths.append(path)
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  quiet_libraries()
  from transformer_jax import checkpoints, data, decode, inference
  FLAGS = flags.FLAGS
  try:
    run = inference.load_run(FLAGS.workdir)
    (_, steps, from_best), = run.select(FLAGS.checkpoint)
    params = run.params(steps, from_best)
  except (checkpoints.CheckpointError, FileNotFoundError, ValueError) as e:
    sys.exit(f"attention_maps: {e}")
  tok = run.tokenizer
  translation = FLAGS.translation
  if not translation:
    eval_set = data.EvalSet.from_pairs([FLAGS.sentence], [], tok)
    translation = decode.translate(run.model, params, eval_set, tok, run.cfg.decode)[0]
  source_ids, target_ids = tok.encode(FLAGS.sentence), tok.encode(translation)
  weights = attention_weights(run.model, params, source_ids, target_ids)
  out_dir = Path(FLAGS.output_dir) if FLAGS.output_dir else Path(FLAGS.workdir) / "attention"
  paths = plot_attention(weights, tok.pieces(source_ids), tok.pieces(target_ids), out_dir)
  print(f"source: {FLAGS.sentence}\ntranslation: {translation}")
  print("\n".join(str(p) for p in paths))


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "A training workdir.")
  flags.DEFINE_string("sentence", None, "The source sentence.")
  flags.DEFINE_string("translation", "", "Its translation (default: the model's own).")
  flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N")
  flags.DEFINE_string("output_dir", "", "Where to write (default <workdir>/attention).")
  flags.mark_flags_as_required(["workdir", "sentence"])
  app.run(main)
