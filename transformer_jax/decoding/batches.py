"""Decoding whole sets: length-sorted batches of a few shapes (each compiles once), split over
the mesh's batch axes, turned back into text in input order."""

from __future__ import annotations

import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.tokenizer import EOS_ID, content_ids
from transformer_jax.decoding import resizing
from transformer_jax.decoding.mbr import mbr_chosen
from transformer_jax.decoding.rules import TokenRules
from transformer_jax.decoding.search import beam_search, greedy_search
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.parallel import mesh as mesh_lib


def sentence_caps(cfg: DecodeConfig, inputs_BS: np.ndarray, prefixes_BP: np.ndarray | None,
                  model_max_len: int) -> np.ndarray:
  """Each sentence's length cap (`caps_of_lengths`) from its padded ids (0: padding)."""
  return caps_of_lengths(cfg, (inputs_BS > 0).sum(axis=1),
                         None if prefixes_BP is None else (prefixes_BP > 0).sum(axis=1),
                         model_max_len)


def caps_of_lengths(cfg: DecodeConfig, source_lengths, prefix_lengths, model_max_len: int
                    ) -> np.ndarray:
  """Each sentence's length cap: min(max_length, a * its source length + b), at least its
  forced prefix and EOS, at most the model's positions; 0 for an empty (padding) row."""
  lengths = np.asarray(source_lengths)
  caps = np.array([min(cfg.length_limit(int(n)), model_max_len) for n in lengths], np.int32)
  if prefix_lengths is not None:
    caps = np.minimum(np.maximum(caps, np.asarray(prefix_lengths) + 1), model_max_len)
  return np.where(lengths > 0, caps, 0).astype(np.int32)


def search_settings(cfg: DecodeConfig) -> dict:
  """The search's settings for `cfg` (beam search's; greedy search and sampling take
  temperature, top_k, top_p and the rules): what its compiled programs are specialised to."""
  return dict(beam_size=cfg.beam_size, beam_impl=cfg.beam_impl, alpha=cfg.length_penalty,
              num_return=cfg.mbr_candidates if cfg.mbr else cfg.nbest, min_len=cfg.min_length,
              rules=TokenRules.of(cfg))


def decode_batches(scorer, eval_set, cfg: DecodeConfig, mesh=None, counts=None):
  """Decodes every source of `eval_set`; yields (row indices, sequences (B, N, L), scores
  (B, N)) per batch, N = the candidates asked for (cfg.nbest, or cfg.mbr_candidates with
  MBR), best first for beam search. `scorer`: the model's decoding interface (one model's or
  an ensemble's, made ready once: `ensemble.prepare`); the set's target prefixes, if any,
  are forced.

  Batches are length-sorted; each sentence has its own length cap (`sentence_caps`), so its
  translation does not depend on the batch. A batch has `cfg.batch_size` rows, the last one
  the smallest of a few sizes that holds it (`resizing.row_sizes`), split over the mesh's
  batch axes; sentences leave the search as they finish (see `search`). Samples (MBR over
  samples) are drawn together, a row per sample, each from its own key, made from the seed
  and the sentence's own ids: a sample does not depend on the sentence's neighbours or its
  place in the input (the same source, the same sample). `counts`: a Counter
  that adds up the work done (see `search.beam_search`).
  """
  unit, batch_size = 1, cfg.batch_size
  if mesh is not None:
    unit = mesh_lib.data_parallel_size(mesh)
    batch_size = mesh_lib.round_up_to_data_parallel(batch_size, mesh)
  sizes = resizing.row_sizes(batch_size, unit)
  max_positions = scorer.max_len
  settings = search_settings(cfg)
  candidates = settings["num_return"]
  draws = candidates if cfg.sampling else 1
  for rows, batch in eval_set.batches(batch_size, max_len=max_positions):
    size = resizing.fitting_size(len(rows), sizes)
    inputs, prefixes = batch["inputs"][:size], batch.get("prefixes")
    if prefixes is not None:
      prefixes = prefixes[:size]
    caps = sentence_caps(cfg, inputs, prefixes, max_positions)
    max_len = max(1, int(caps.max()))
    if draws > 1:  # a row per (sentence, draw), a sentence's draws consecutive
      inputs, caps = np.repeat(inputs, draws, axis=0), np.repeat(caps, draws)
      prefixes = None if prefixes is None else np.repeat(prefixes, draws, axis=0)
    if mesh is not None:  # every host holds the whole batch; each places its own part
      inputs = mesh_lib.global_array_from_full(inputs, mesh)
      if prefixes is not None:
        prefixes = mesh_lib.global_array_from_full(prefixes, mesh)
    if cfg.greedy or cfg.sampling:
      rng = None
      if cfg.sampling:  # (draw n of a sentence: the seed folded with its ids' hash, then n)
        ids = np.zeros((size,), np.uint32)
        ids[:len(rows)] = [zlib.crc32(np.asarray(eval_set.source_ids[i], "<i4").tobytes())
                           for i in rows]
        base_rng = jax.random.PRNGKey(cfg.seed)
        rng = jax.vmap(lambda i, n: jax.random.fold_in(jax.random.fold_in(base_rng, i), n))(
            jnp.repeat(ids, draws), jnp.tile(jnp.arange(draws), size))
      seqs, scores = greedy_search(scorer, inputs, max_len=max_len, rng=rng,
                                   temperature=cfg.temperature, top_k=cfg.top_k,
                                   top_p=cfg.top_p, prefix_BP=prefixes, caps=caps, unit=unit,
                                   counts=counts, rules=settings["rules"])
      seqs, scores = seqs.reshape(size, draws, -1), scores.reshape(size, draws)
    else:
      seqs, scores = beam_search(scorer, inputs, max_len=max_len, prefix_BP=prefixes,
                                 caps=caps, unit=unit, counts=counts, **settings)
      seqs, scores = seqs[:, :candidates], scores[:, :candidates]
    yield rows, seqs, scores


class Hypothesis(NamedTuple):
  """A translation: its text, its score (beam: length-normalised; greedy and sampling: the
  total log-probability), the ids the search produced (up to EOS, padding dropped) and
  whether it ended with EOS (False: its sentence's length cap stopped it)."""
  text: str
  score: float
  ids: tuple[int, ...]
  ended: bool = True


def translate_nbest(scorer, eval_set, tokenizer, cfg: DecodeConfig, mesh=None,
                    on_batch=None) -> list[list[Hypothesis]]:
  """For every source, in order: its `cfg.nbest` hypotheses, best first. `on_batch(n)` (e.g.
  a progress bar's update) is called after each batch of n sentences."""
  out: list[list[Hypothesis]] = [[] for _ in range(len(eval_set))]
  for rows, seqs, scores in decode_batches(scorer, eval_set, cfg, mesh):
    for row, index in enumerate(rows):
      out[index] = [Hypothesis(tokenizer.detokenize(seqs[row, n]), float(scores[row, n]),
                               tuple(content_ids(seqs[row, n])),
                               bool((seqs[row, n] == EOS_ID).any()))
                    for n in range(seqs.shape[1]) if scores[row, n] > NEG_INF / 2]
      if cfg.mbr:  # (the candidates reordered by expected utility; their scores kept)
        out[index] = mbr_chosen(out[index], cfg.mbr, cfg.nbest)
    if on_batch is not None:
      on_batch(len(rows))
  return out
