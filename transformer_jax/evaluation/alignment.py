"""Word alignments of translations from the encoder–decoder attention: each target word linked
to the source word its subwords attend to most, in one decoder layer averaged over heads
(teacher-forced on the source and the translation), printed as Pharaoh `i-j` pairs (source
word i, target word j, counted from 0 in the whitespace-separated words).

The default layer is the penultimate decoder layer (Garg et al., 2019, "Jointly Learning to
Align and Translate with Transformer Models": its attention gives the best unsupervised
alignments of the layers), the only one of a one-layer decoder.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.evaluation.attention_maps import weights_model

WORD_START = "\u2581"  # SentencePiece's marker of a piece that begins a word
BUCKET = 16  # padded lengths are multiples of this: few shapes, few compilations


def default_layer(num_decoder_layers: int) -> int:
  return max(num_decoder_layers - 2, 0)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _cross_attention(model, params, inputs_BS, targets_BT, layer: int):
  """(B, T, S): decoder layer `layer`'s cross-attention weights, averaged over heads."""
  inter = model.apply({"params": params}, inputs_BS, targets_BT, mutable=["intermediates"])[1]
  return inter["intermediates"][f"decoder_{layer}"]["cross_attention"][
      "attention_weights"][0].mean(axis=1)


def cross_attention(model, params, sources: list[np.ndarray], targets: list[np.ndarray],
                    layer: int, batch_size: int = 64) -> list[np.ndarray]:
  """Each pair's (target length, source length) head-averaged cross-attention of `layer`."""
  model, params = weights_model(model, params)
  out = []
  for start in range(0, len(sources), batch_size):
    src, tgt = sources[start:start + batch_size], targets[start:start + batch_size]
    inputs, targets_BT = (_padded(rows) for rows in (src, tgt))
    weights = np.asarray(_cross_attention(model, params, inputs, targets_BT, layer))
    out.extend(w[:len(t), :len(s)] for w, s, t in zip(weights, src, tgt))
  return out


def _padded(rows: list[np.ndarray]) -> np.ndarray:
  width = -(-max(len(r) for r in rows) // BUCKET) * BUCKET
  out = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def word_indices(pieces: list[str]) -> list[int]:
  """The word each piece belongs to: a new word at each piece that starts with '▁'."""
  words, index = [], -1
  for n, piece in enumerate(pieces):
    if n == 0 or piece.startswith(WORD_START):
      index += 1
    words.append(index)
  return words


def word_alignment(attention_TS: np.ndarray, source_pieces: list[str],
                   target_pieces: list[str]) -> list[tuple[int, int]]:
  """(source word, target word) pairs: each target word to the source word that receives the
  most attention (summed over its pieces and over the target word's pieces). The pieces
  exclude EOS (and any source tag); `attention_TS` rows and columns follow them."""
  if not source_pieces or not target_pieces:
    return []
  source_words, target_words = word_indices(source_pieces), word_indices(target_pieces)
  a = np.asarray(attention_TS, np.float64)[:len(target_pieces), :len(source_pieces)]
  by_source = np.zeros((len(target_pieces), source_words[-1] + 1))
  np.add.at(by_source.T, source_words, a.T)  # (pieces of a source word summed)
  words = np.zeros((target_words[-1] + 1, by_source.shape[1]))
  np.add.at(words, target_words, by_source)
  return [(int(i), j) for j, i in enumerate(words.argmax(axis=1))]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
  return " ".join(f"{i}-{j}" for i, j in pairs)


def align(model, params, tokenizer, eval_set, translations: list[str],
          layer: int | None = None) -> list[str]:
  """The Pharaoh alignment of each translation to its source in `eval_set` (its source ids as
  decoded, a tag's first when the set has one). An ensemble (tuples of models and params):
  its first model's attention."""
  if isinstance(model, tuple):
    model, params = model[0], params[0]
  source_ids, prefix_length = eval_set.source_ids, len(eval_set.source_prefix)
  cfg = model.config
  layer = default_layer(cfg.num_decoder_layers) if layer is None else layer
  if not 0 <= layer < cfg.num_decoder_layers:
    raise ValueError(f"alignment layer {layer}: the decoder has layers 0 to "
                     f"{cfg.num_decoder_layers - 1}")
  targets = [np.asarray(tokenizer.encode(t, "target"), np.int32) for t in translations]
  weights = cross_attention(model, params, [np.asarray(s, np.int32) for s in source_ids],
                            targets, layer)
  out = []
  for w, s, t in zip(weights, source_ids, targets):
    source_pieces = tokenizer.pieces([i for i in s[prefix_length:] if i != EOS_ID])
    target_pieces = tokenizer.pieces(t[:-1])  # (EOS dropped)
    w = w[:, prefix_length:prefix_length + len(source_pieces)]
    out.append(pharaoh(word_alignment(w, source_pieces, target_pieces)))
  return out
