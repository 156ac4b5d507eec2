"""Training on a mixture of corpora (`config.data.corpora`), each with a weight and a tag.

Each corpus is tokenized once (its own `data.tokenized` store) and read in its own order: its
pairs (this host's shard) shuffled anew every epoch with a seed of its own, repeated. The
mixture interleaves these streams by weight with grain's `MapDataset.mix`: deterministic
proportional interleaving (not independent draws), so any stretch of the stream holds each
corpus's share of pairs to within a pair or two, the same for every seed; the seed shuffles
within each corpus. Position i of the stream is a pure function of i, so the iterator state
(and exact resume) is that of the one-corpus path. A tagged corpus has its tag's id (a piece of
its own in the tokenizer) prepended to every source, after EOS-counted length filtering that
counts it. The weights are shares of the pairs drawn, before length filtering; the metrics
report what each corpus gave (`data/corpus/NAME/...`).
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import packing, tokenized


class _Tagged:
  """Maps a corpus's pair index j to (corpus index, j) (picklable, for grain's workers)."""

  def __init__(self, index: int):
    self.index = index

  def __call__(self, j):
    return np.int32(self.index), np.int64(j)


@dataclasses.dataclass(frozen=True)
class MixedCorpus:
  """A corpus of the plan, tokenized and counted, ready to read."""
  name: str
  store: tokenized.TokenizedSplit
  prefix: tuple[int, ...]    # ids prepended to each source (the tag)
  weight: float
  counts: tuple[int, int, int]  # this host's shard: kept, empty, too long


def mixed_order(sizes: list[int], weights: list[float], seed: int, process_index: int,
                process_count: int) -> grain.MapDataset:
  """(corpus index, pair index) of the mixed stream of this host's shards, endless."""
  streams = [grain.MapDataset.range(n)[process_index::process_count]
             .shuffle(seed=(seed * 1_000_003 + i) % 2**31).repeat().map(_Tagged(i))
             for i, n in enumerate(sizes)]
  return grain.MapDataset.mix(streams, weights)


class ReadMixedChunk:
  """Reads and filters a chunk of (corpus, pair) indices from the corpora's stores, tags
  prepended (picklable, for grain's worker processes)."""

  def __init__(self, corpora_: list[MixedCorpus], cfg: DataConfig):
    self.corpora, self.cfg = corpora_, cfg

  def __call__(self, picked) -> dict[str, np.ndarray]:
    which, indices = (np.asarray(a) for a in picked)
    codes = np.empty(len(which), np.int8)
    src: list[np.ndarray] = [np.empty(0, np.int32)] * len(which)
    tgt: list[np.ndarray] = list(src)
    for c, corpus in enumerate(self.corpora):
      at = np.flatnonzero(which == c)
      if not len(at):
        continue
      (s0, s1), (t0, t1) = (corpus.store.bounds(side, indices[at]) for side in tokenized.SIDES)
      corpus_codes = tokenized.filter_codes(s1 - s0, t1 - t0, self.cfg, len(corpus.prefix))
      codes[at] = corpus_codes
      kept = corpus_codes == tokenized.KEEP
      for side, out, start, end, prefix in (("source", src, s0, s1, corpus.prefix),
                                            ("target", tgt, t0, t1, ())):
        ids = corpus.store.read_ids(side, start[kept], end[kept])
        pieces = np.split(ids, np.cumsum(end[kept] - start[kept])[:-1])
        for position, piece in zip(at[kept], pieces):
          out[position] = np.concatenate([np.asarray(prefix, np.int32), piece]) if prefix \
              else piece
    kept = np.flatnonzero(codes == tokenized.KEEP)
    src_flat, tgt_flat = ((np.concatenate([side[i] for i in kept]) if len(kept)
                           else np.empty(0, np.int32),
                           np.asarray([len(side[i]) for i in kept], np.int64))
                          for side in (src, tgt))
    return packing.chunk(codes, src_flat, tgt_flat, which.astype(np.int64))
