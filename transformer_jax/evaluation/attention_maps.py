"""Attention maps: which source subwords each target subword attends to, per layer and head, for
the encoder self-attention, the decoder's masked self-attention and the encoder–decoder
attention (teacher-forced on a sentence pair), and their heatmaps."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import numpy as np

from transformer_jax.model.transformer import unscanned
from transformer_jax.reporting import plots

KINDS = {"encoder_self_attention": ("encoder", "self_attention"),
         "decoder_self_attention": ("decoder", "self_attention"),
         "cross_attention": ("decoder", "cross_attention")}


@functools.partial(jax.jit, static_argnums=0)
def _intermediates(model, params, inputs, targets):
  """What the model sows while computing teacher-forced logits (its attention weights)."""
  return model.apply({"params": params}, inputs, targets, mutable=["intermediates"])[1][
      "intermediates"]


def weights_model(model, params):
  """The model and parameters in the form that sows attention weights: per-layer layout, the
  einsum attention (the fused kernels never materialise the weights)."""
  model, params = unscanned(model, params)
  return model.clone(config=dataclasses.replace(model.config, attention_impl="einsum")), params


def attention_weights(model, params, source_ids, target_ids) -> dict[str, list[np.ndarray]]:
  """Teacher-forced attention weights for one pair: for each kind, a list over layers of
  (heads, queries, keys) arrays. Rows sum to 1 over visible keys; hidden cells are 0. The
  sequences are cut at the model's positions (`max_len`), as decoding cuts them."""
  max_len = model.config.max_len
  inputs = np.asarray(source_ids[:max_len], np.int32)[None]
  targets = np.asarray(target_ids[:max_len], np.int32)[None]
  model, params = weights_model(model, params)
  inter = _intermediates(model, params, inputs, targets)
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
  plt = plots.pyplot()
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
      path = out_dir / f"{prefix}{kind}_layer{layer}.png"
      plots.save(fig, path, dpi=80)
      paths.append(path)
  return paths
