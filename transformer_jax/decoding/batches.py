"""Decoding whole sets: length-sorted batches of fixed shapes (each compiles once), split over
the mesh's batch axes, turned back into text in input order."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.decoding.mbr import mbr_order
from transformer_jax.decoding.search import beam_search, greedy_search
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.parallel import mesh as mesh_lib


def decode_batches(model, params, eval_set, cfg: DecodeConfig, mesh=None):
  """Decodes every source of `eval_set`; yields (row indices, sequences (B, N, L), scores
  (B, N)) per batch, N = the candidates asked for (cfg.nbest, or cfg.mbr_candidates with
  MBR), best first for beam search. `model`/`params`: one model or tuples (an ensemble);
  the set's target prefixes, if any, are forced.

  Batches are length-sorted, padded to a few fixed shapes and (with a mesh) split over its
  batch axes; each shape compiles once, the whole search being one compiled program.
  """
  batch_size = cfg.batch_size
  if mesh is not None:
    batch_size = mesh_lib.round_up_to_data_parallel(batch_size, mesh)
  config = (model if isinstance(model, tuple) else (model,))[0].config
  candidates = cfg.mbr_candidates if cfg.mbr else cfg.nbest
  base_rng = jax.random.PRNGKey(cfg.seed)
  for batch_index, (rows, batch) in enumerate(eval_set.batches(batch_size,
                                                               max_len=config.max_len)):
    inputs, prefixes = batch["inputs"], batch.get("prefixes")
    max_len = min(cfg.length_limit(inputs.shape[1]), config.max_len)
    if prefixes is not None:
      max_len = min(max(max_len, prefixes.shape[1] + 1), config.max_len)
    if mesh is not None:  # every host holds the whole batch; each places its own part
      inputs = mesh_lib.global_array_from_full(inputs, mesh)
      if prefixes is not None:
        prefixes = mesh_lib.global_array_from_full(prefixes, mesh)
    if cfg.greedy or cfg.sampling:
      draws = []
      for n in range(candidates if cfg.sampling else 1):  # (MBR over samples: several draws)
        rng = jax.random.fold_in(base_rng, batch_index) if cfg.sampling else None
        if rng is not None and candidates > 1:
          rng = jax.random.fold_in(rng, n)
        draws.append(greedy_search(model, params, inputs, max_len=max_len, rng=rng,
                                   temperature=cfg.temperature, top_k=cfg.top_k,
                                   top_p=cfg.top_p, prefix_BP=prefixes))
      seqs = jnp.stack([d[0] for d in draws], axis=1)
      scores = jnp.stack([d[1] for d in draws], axis=1)
    else:
      seqs, scores = beam_search(model, params, inputs, beam_size=cfg.beam_size,
                                 alpha=cfg.length_penalty, max_len=max_len,
                                 num_return=candidates, min_len=min(cfg.min_length, max_len),
                                 prefix_BP=prefixes)
      seqs, scores = seqs[:, :candidates], scores[:, :candidates]
    yield rows, mesh_lib.fetch(seqs), mesh_lib.fetch(scores)


def translate_nbest(model, params, eval_set, tokenizer, cfg: DecodeConfig, mesh=None,
                    on_batch=None) -> list[list[tuple[str, float]]]:
  """For every source, in order: its `cfg.nbest` (translation, score) pairs, best first.
  `on_batch(n)` (e.g. a progress bar's update) is called after each batch of n sentences."""
  out: list[list[tuple[str, float]]] = [[] for _ in range(len(eval_set))]
  for rows, seqs, scores in decode_batches(model, params, eval_set, cfg, mesh):
    for row, index in enumerate(rows):
      out[index] = [(tokenizer.decode(seqs[row, n]), float(scores[row, n]))
                    for n in range(seqs.shape[1]) if scores[row, n] > NEG_INF / 2]
      if cfg.mbr:  # (the candidates reordered by expected utility; their scores kept)
        out[index] = [out[index][i] for i in mbr_order([t for t, _ in out[index]], cfg.mbr)]
        out[index] = out[index][:cfg.nbest]
    if on_batch is not None:
      on_batch(len(rows))
  return out


def translate(model, params, eval_set, tokenizer, cfg: DecodeConfig, mesh=None,
              on_batch=None) -> list[str]:
  """The best translation of every source in `eval_set`, in its order (`on_batch`: as for
  translate_nbest)."""
  single = dataclasses.replace(cfg, nbest=1)
  return [hyps[0][0] if hyps else "" for hyps in
          translate_nbest(model, params, eval_set, tokenizer, single, mesh, on_batch)]
