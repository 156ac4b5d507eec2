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

from transformer_jax.data.tokenizer import EOS_ID, content_ids
from transformer_jax.evaluation.attention_maps import weights_model

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
  """Each pair's (target length, source length) head-averaged cross-attention of `layer`; the
  sequences cut at the model's positions (`max_len`), as decoding cuts them."""
  model, params = weights_model(model, params)
  max_len = model.config.max_len
  sources, targets = [s[:max_len] for s in sources], [t[:max_len] for t in targets]
  out = []
  for start in range(0, len(sources), batch_size):
    src, tgt = sources[start:start + batch_size], targets[start:start + batch_size]
    inputs, targets_BT = (_padded(rows, max_len) for rows in (src, tgt))
    weights = np.asarray(_cross_attention(model, params, inputs, targets_BT, layer))
    out.extend(w[:len(t), :len(s)] for w, s, t in zip(weights, src, tgt))
  return out


def _padded(rows: list[np.ndarray], max_len: int) -> np.ndarray:
  width = min(-(-max(len(r) for r in rows) // BUCKET) * BUCKET, max_len)
  out = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def word_alignment(attention_TS: np.ndarray, source_words: list[int],
                   target_words: list[int]) -> list[tuple[int, int]]:
  """(source word, target word) pairs: each target word to the source word that receives the
  most attention (summed over its pieces and over the target word's pieces). `source_words`
  and `target_words`: the word of each piece (`Tokenizer.encode_words`/`detokenize_words`), whose
  columns and rows of `attention_TS` they are."""
  if not source_words or not target_words:
    return []
  a = np.asarray(attention_TS, np.float64)[:len(target_words), :len(source_words)]
  by_source = np.zeros((a.shape[0], max(source_words) + 1))
  np.add.at(by_source.T, source_words[:a.shape[1]], a.T)  # (pieces of a source word summed)
  words = np.zeros((max(target_words) + 1, by_source.shape[1]))
  np.add.at(words, target_words[:a.shape[0]], by_source)
  spelled = sorted(set(target_words[:a.shape[0]]))  # (a word past the cut has no row)
  return [(int(words[j].argmax()), j) for j in spelled]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
  return " ".join(f"{i}-{j}" for i, j in pairs)


def align(model, params, tokenizer, eval_set, target_ids: list, layer: int | None = None
          ) -> list[str]:
  """The Pharaoh alignment of each translation (`target_ids`: the ids the search produced,
  up to EOS) to its source in `eval_set`, in the whitespace-separated words of the source as
  given and of the translation as printed (`tokenizer.detokenize`). The source is encoded after
  the set's tag, as decoded; a language tag in the text is not a word a target word aligns
  to. An ensemble (tuples of models and params): its first model's attention."""
  if isinstance(model, tuple):
    model, params = model[0], params[0]
  cfg = model.config
  layer = default_layer(cfg.num_decoder_layers) if layer is None else layer
  if not 0 <= layer < cfg.num_decoder_layers:
    raise ValueError(f"alignment layer {layer}: the decoder has layers 0 to "
                     f"{cfg.num_decoder_layers - 1}")
  prefix = list(eval_set.source_prefix)
  sources = [tokenizer.encode_words(text) for text in eval_set.sources]
  targets = [content_ids(ids) for ids in target_ids]
  weights = cross_attention(
      model, params, [np.asarray(prefix + ids + [EOS_ID], np.int32) for ids, _ in sources],
      [np.asarray(ids + [EOS_ID], np.int32) for ids in targets], layer)
  tags = set(tokenizer.language_tags)
  out = []
  for w, (source_ids, source_words), ids in zip(weights, sources, targets):
    w = w[:, len(prefix):]  # (the set's tag: no word of the source)
    is_tag = np.array([p in tags for p in tokenizer.pieces(source_ids[:w.shape[1]])], bool)
    w = np.where(is_tag[None, :], 0.0, w[:, :len(is_tag)])
    out.append(pharaoh(word_alignment(w, source_words[:len(is_tag)],
                                      tokenizer.detokenize_words(ids)[1])))
  return out
